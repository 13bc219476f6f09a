"""Recorders: round trips at every precision, the file layouts, atomic saves, and every error."""

from __future__ import annotations

import json
import math
import os
import re
import struct
import zlib
from pathlib import Path

import msgpack
import numpy as np
import pytest

import ember
from ember import DType, TensorData
from ember.backend.errors import (
    ArgumentError,
    RecordError,
    RecordFileNotFoundError,
    RecordFormatError,
)
from ember.record.precision import (
    BF16Precision,
    DoublePrecision,
    FullPrecision,
    HalfPrecision,
    PrecisionSettings,
)
from ember.record.recorder import (
    BinBytesRecorder,
    BinFileRecorder,
    BinGzFileRecorder,
    CompactRecorder,
    DefaultRecorder,
    JsonGzFileRecorder,
    NamedMpkFileRecorder,
    NamedMpkGzFileRecorder,
    PrettyJsonFileRecorder,
    SensitiveCompactRecorder,
)
from ember.record.safetensors import read_safetensors, write_safetensors
from ember.tensor.data import numpy_dtype

FILE_RECORDERS = [NamedMpkFileRecorder, NamedMpkGzFileRecorder, BinFileRecorder,
                  BinGzFileRecorder, JsonGzFileRecorder, PrettyJsonFileRecorder]
RECORDERS = [*FILE_RECORDERS, BinBytesRecorder]
GZIP_RECORDERS = [NamedMpkGzFileRecorder, BinGzFileRecorder, JsonGzFileRecorder]
PRECISIONS = [DoublePrecision, FullPrecision, HalfPrecision, BF16Precision]
EXTENSIONS = {NamedMpkFileRecorder: "mpk", NamedMpkGzFileRecorder: "mpk.gz",
              BinFileRecorder: "bin", BinGzFileRecorder: "bin.gz",
              JsonGzFileRecorder: "json.gz", PrettyJsonFileRecorder: "json"}
FORMATS = {NamedMpkFileRecorder: "ember.named-mpk", NamedMpkGzFileRecorder: "ember.named-mpk",
           BinFileRecorder: "ember.bin", BinGzFileRecorder: "ember.bin",
           JsonGzFileRecorder: "ember.json", PrettyJsonFileRecorder: "ember.json",
           BinBytesRecorder: "ember.bin"}


def _name(value):
    return getattr(value, "__name__", None) or repr(value)


# ------------------------------------------------------------------------ records
def _tensors() -> dict[str, TensorData]:
    rng = np.random.default_rng(7)
    specials = [0.0, -0.0, 1.0, -2.5, math.nan, math.inf, -math.inf, 1e-40, 1e-8, 70000.0,
                3.4e38, 1e300, 0.1, 1 / 3]
    floats = np.array(specials + list(rng.standard_normal(10)), dtype=np.float64)
    tensors = {
        "f64": TensorData(floats.reshape(4, 6)),
        "f32": TensorData(floats[:12].reshape(2, 2, 3), "f32"),
        "f16": TensorData(floats[:8], "f16"),
        "bf16": TensorData(floats[:8], "bf16"),
        "i64": TensorData(np.array([-32768, -1, 0, 7, 32767, 12], dtype=np.int64).reshape(2, 3)),
        "i32": TensorData(np.array([1, -2, 300], dtype=np.int32)),
        "i16": TensorData(np.array([[-5, 6]], dtype=np.int16)),
        "i8": TensorData(np.array([-128, 127], dtype=np.int8)),
        "u8": TensorData(np.array([0, 128, 255], dtype=np.uint8)),
        "bool": TensorData(np.array([[True, False], [False, True]])),
        "scalar_f32": TensorData(np.array(2.5, dtype=np.float32)),
        "scalar_i64": TensorData(np.array(-3, dtype=np.int64)),
        "scalar_bool": TensorData(np.array(True)),
        "empty_f32": TensorData(np.zeros((0, 3), dtype=np.float32)),
        "empty_i32": TensorData(np.zeros((0,), dtype=np.int32)),
        "empty_bool": TensorData(np.zeros((2, 0), dtype=bool)),
        # Bigger than the inline threshold of the MessagePack writer: a chunk of its own.
        "big": TensorData(rng.standard_normal(40_000).astype(np.float32)),
    }
    return tensors


def sample_record() -> dict:
    tensors = _tensors()
    shared = {"k": [1, 2]}  # reached twice but not a cycle: saved twice
    return {
        "encoder": {
            "layers": [
                {"weight": {"id": "11", "param": tensors["f32"]}, "bias": None},
                {"weight": {"id": "12", "param": tensors["f64"]},
                 "bias": {"id": "13", "param": tensors["scalar_f32"]}},
            ],
        },
        "tensors": tensors,
        "scalars": {
            "int": 5, "min": -(2**63), "max": 2**64 - 1, "float": 0.1, "third": 1 / 3,
            "nan": math.nan, "inf": math.inf, "ninf": -math.inf, "neg_zero": -0.0,
            "true": True, "false": False, "none": None, "text": "héllo ✓ \n\"q\"",
            "bytes": b"\x00\xff\x10", "empty_bytes": b"", "empty_text": "",
        },
        "tuple": (1, (2.0, "three"), [None]),
        "$dollar": {"$tensor": 1, "$$x": [2], "plain": {"$bytes": "not base64"}},
        "empty": {},
        "empty_list": [],
        "dag": [shared, shared],
        "optimizer": {"step": 5, "state": {"11": {"momentum": tensors["f32"]}}},
    }


def expected_record(value, precision: PrecisionSettings):
    """What a round trip at ``precision`` gives: tensors converted by NumPy's own ``astype``."""
    if isinstance(value, TensorData):
        target = numpy_dtype(precision.target(value.dtype))
        with np.errstate(over="ignore"):  # f64 / f32 beyond the f16 range become inf
            return TensorData._wrap(value.to_numpy().astype(target))
    if isinstance(value, dict):
        return {key: expected_record(item, precision) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [expected_record(item, precision) for item in value]
    return value


def assert_same(actual, expected, path="record"):
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    if isinstance(expected, TensorData):
        assert actual.dtype is expected.dtype, f"{path}: {actual.dtype} != {expected.dtype}"
        assert actual.shape == expected.shape, path
        a, e = actual.to_numpy(), expected.to_numpy()
        if expected.dtype.is_float:
            a, e = a.astype(np.float64), e.astype(np.float64)
            assert np.array_equal(np.signbit(a), np.signbit(e)) or np.isnan(e).any(), path
            assert np.array_equal(np.isnan(a), np.isnan(e)), path
            a, e = np.nan_to_num(a, nan=0.0), np.nan_to_num(e, nan=0.0)
        assert np.array_equal(a, e), f"{path}: {a} != {e}"
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), path
        for key in expected:
            assert_same(actual[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), path
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{path}.{i}")
    elif isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(actual), path
    elif isinstance(expected, float):
        assert actual == expected and math.copysign(1, actual) == math.copysign(1, expected), path
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


# --------------------------------------------------------------------- round trips
@pytest.mark.parametrize("precision", PRECISIONS, ids=_name)
@pytest.mark.parametrize("recorder_type", RECORDERS, ids=_name)
def test_round_trip_at_every_precision(recorder_type, precision):
    record = sample_record()
    recorder = recorder_type(precision)
    data = recorder.to_bytes(record)
    loaded, metadata = recorder.from_bytes_with_metadata(data)
    assert_same(loaded, expected_record(record, precision))
    assert metadata == {
        "format": FORMATS[recorder_type],
        "version": 1,
        "ember_version": ember.__version__,
        "precision": {"name": precision.name, "float": precision.float_dtype.value,
                      "int": precision.int_dtype.value},
        "compression": "gzip" if recorder_type in GZIP_RECORDERS else None,
    }
    assert recorder.from_bytes(bytearray(data)) is not None  # any bytes-like object loads
    assert recorder.to_bytes(record) == data  # deterministic (gzip without a timestamp)


def test_bool_and_bytes_keep_their_dtype_and_ints_widen():
    # Bytes (u8, i8: quantized values) stay bytes; other ints take the settings' int dtype.
    record = {"b": TensorData([True]), "u": TensorData(np.array([255], np.uint8)),
              "i": TensorData(np.array([-3], np.int8)), "s": TensorData(np.array([7], np.int16))}
    recorder = BinBytesRecorder(HalfPrecision)
    loaded = recorder.from_bytes(recorder.to_bytes(record))
    assert [loaded[k].dtype for k in "buis"] == [DType.BOOL, DType.U8, DType.I8, DType.I16]
    assert loaded["i"].tolist() == [-3]
    wide = PrecisionSettings("x", "f32", "i64")
    assert wide.target(DType.I8) is DType.I8 and wide.target(DType.I16) is DType.I64


@pytest.mark.parametrize("recorder_type", RECORDERS, ids=_name)
def test_unsigned_ints_keep_their_dtype_and_full_range(recorder_type, tmp_path):
    # A signed int_dtype cannot hold u16 / u32 / u64 values: unsigned tensors stay unsigned.
    record = {name: TensorData(np.array([0, 1, np.iinfo(dtype).max], dtype))
              for name, dtype in (("u16", np.uint16), ("u32", np.uint32), ("u64", np.uint64))}
    recorder = recorder_type(FullPrecision)
    loaded = recorder.from_bytes(recorder.to_bytes(record))
    for name, expected in record.items():
        assert loaded[name].dtype is expected.dtype
        np.testing.assert_array_equal(loaded[name].to_numpy(), expected.to_numpy())
    write_safetensors(tmp_path / "u.safetensors", record)
    back, _ = read_safetensors(tmp_path / "u.safetensors")
    assert {name: t.dtype for name, t in back.items()} == {n: t.dtype for n, t in record.items()}


def test_floats_beyond_half_range_become_inf_not_an_error():
    record = {"w": TensorData([70000.0, -1e6, 1.0], "f32")}
    for recorder in (NamedMpkFileRecorder(HalfPrecision), JsonGzFileRecorder(HalfPrecision)):
        loaded = recorder.from_bytes(recorder.to_bytes(record))
        assert loaded["w"].tolist() == [math.inf, -math.inf, 1.0]


def test_loading_keeps_the_stored_dtype_whatever_the_reader_precision():
    data = NamedMpkFileRecorder(DoublePrecision).to_bytes({"w": TensorData([0.1], "f32")})
    loaded = NamedMpkFileRecorder(HalfPrecision).from_bytes(data)
    assert loaded["w"].dtype is DType.F64


@pytest.mark.parametrize("recorder_type", FILE_RECORDERS, ids=_name)
def test_save_adds_the_extension_once_and_load_finds_the_file(recorder_type, tmp_path):
    recorder = recorder_type()
    extension = EXTENSIONS[recorder_type]
    assert recorder.extension == recorder.kind == extension
    record = {"w": TensorData([1.0, 2.0], "f32"), "n": 3}
    path = recorder.save(record, tmp_path / "model")
    assert path == tmp_path / f"model.{extension}"
    assert recorder.save(record, path) == path
    assert recorder.save(record, str(tmp_path / "model.v2")) == tmp_path / f"model.v2.{extension}"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"model.{extension}",
                                                         f"model.v2.{extension}"]
    for where in (tmp_path / "model", path, str(path)):
        assert_same(recorder.load(where), expected_record(record, FullPrecision))
    loaded, metadata = recorder.load_with_metadata(tmp_path / "model")
    assert metadata["precision"]["float"] == "f32" and loaded["n"] == 3
    assert path.read_bytes() == recorder.to_bytes(record)


def test_load_tries_the_path_as_given_first(tmp_path):
    recorder = BinFileRecorder()
    recorder.save({"which": "with extension"}, tmp_path / "weights")
    (tmp_path / "weights").write_bytes(recorder.to_bytes({"which": "as given"}))
    assert recorder.load(tmp_path / "weights") == {"which": "as given"}


def test_aliases_change_only_the_default_precision(tmp_path):
    assert DefaultRecorder().precision is FullPrecision
    assert CompactRecorder().precision is HalfPrecision
    assert SensitiveCompactRecorder().precision is FullPrecision
    assert CompactRecorder(DoublePrecision).precision is DoublePrecision
    assert (DefaultRecorder.extension, CompactRecorder.extension) == ("mpk", "mpk.gz")
    path = CompactRecorder().save({"w": TensorData([1.0], "f32")}, tmp_path / "m")
    assert NamedMpkGzFileRecorder().load(path)["w"].dtype is DType.F16
    path = NamedMpkFileRecorder().save({"x": 1}, tmp_path / "d")
    assert DefaultRecorder().load(path) == {"x": 1}
    assert repr(CompactRecorder()) == "CompactRecorder(HalfPrecision)"


def test_bad_precision_arguments():
    with pytest.raises(ArgumentError, match="precision must be a PrecisionSettings"):
        NamedMpkFileRecorder("full")
    with pytest.raises(ArgumentError, match="float_dtype must be a float dtype, got i32"):
        PrecisionSettings("x", "i32", "i32")
    with pytest.raises(ArgumentError, match="int_dtype must be a signed int dtype, got u8"):
        PrecisionSettings("x", "f32", "u8")
    assert repr(PrecisionSettings("x", "f32", "i64")) == (
        "PrecisionSettings('x', float_dtype='f32', int_dtype='i64')")


# ---------------------------------------------------------- layouts, without ember
def test_named_mpk_reads_with_plain_msgpack():
    record = {"w": TensorData([[1.0, 2.0]], "f32"), "$k": b"\x01"}
    top = msgpack.unpackb(NamedMpkFileRecorder().to_bytes(record), raw=False)
    assert list(top) == ["format", "version", "ember_version", "precision", "record"]
    payload = top["record"]["w"]["$tensor"]
    assert (payload["dtype"], payload["shape"]) == ("f32", [1, 2])
    assert np.frombuffer(payload["data"], "<f4").tolist() == [1.0, 2.0]
    assert top["record"]["$$k"] == b"\x01"


def test_bin_layout_is_header_index_then_aligned_tensors():
    record = {"a": TensorData(np.arange(3, dtype=np.int16)),
              "b": {"c": TensorData(np.ones((5, 7), dtype=np.float64))}}
    data = BinBytesRecorder(DoublePrecision).to_bytes(record)
    magic, index_nbytes, data_nbytes = struct.unpack_from("<8sQQ", data)
    start = -(-(24 + index_nbytes) // 64) * 64
    assert magic == b"EMBERBIN" and len(data) == start + data_nbytes
    index = msgpack.unpackb(data[24:24 + index_nbytes], raw=False)
    assert index["format"] == "ember.bin" and index["precision"]["int"] == "i64"
    c = index["record"]["b"]["c"]["$tensor"]
    assert c["offset"] % 64 == 0 and c["offset"] > 0 and c["nbytes"] == 5 * 7 * 8
    values = np.frombuffer(data, "<f8", 35, start + c["offset"]).reshape(c["shape"])
    assert (values == 1).all()
    loaded = BinBytesRecorder().from_bytes(data)
    a, c_loaded = loaded["a"].to_numpy(), loaded["b"]["c"].to_numpy()
    assert a.dtype == np.int64 and a.tolist() == [0, 1, 2]
    # Views of one buffer, not copies: loading does no per-tensor work beyond frombuffer.
    assert c_loaded.base is not None and c_loaded.ctypes.data % 64 == a.ctypes.data % 64


def test_json_is_plain_json_with_strings_for_non_finite_floats():
    record = {"w": TensorData([1.5, math.nan, math.inf, -math.inf], "f32"), "x": math.nan,
              "b": b"hi"}
    text = PrettyJsonFileRecorder().to_bytes(record).decode("utf-8")

    def no_constants(name):
        raise AssertionError(f"bare {name} in JSON")

    top = json.loads(text, parse_constant=no_constants)
    assert '\n      "$tensor": {\n        "dtype": "f32",\n        "shape": [4],' in text
    assert top["record"]["w"] == {"$tensor": {"dtype": "f32", "shape": [4],
                                              "values": [1.5, "nan", "inf", "-inf"]}}
    assert top["record"]["x"] == {"$float": "nan"} and top["record"]["b"] == {"$bytes": "aGk="}
    compact = zlib.decompress(JsonGzFileRecorder().to_bytes(record), 31)
    assert json.loads(compact) == top and b"\n" not in compact


def test_f64_values_survive_json_exactly():
    scales = 10.0 ** np.arange(-300, 300).repeat(2)[:1000]
    extremes = [5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -0.0]
    values = np.concatenate([np.random.default_rng(3).standard_normal(1000) * scales, extremes])
    record = {"w": TensorData(values)}
    loaded = JsonGzFileRecorder(DoublePrecision).from_bytes(
        JsonGzFileRecorder(DoublePrecision).to_bytes(record))
    assert loaded["w"].to_numpy().tobytes() == values.tobytes()


# --------------------------------------------------------------------- atomicity
def _fail_fsync(monkeypatch, recorder):
    def fail(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", fail)


def _fail_mid_stream(monkeypatch, recorder):
    chunks = recorder.chunks

    def failing(record):
        def generate():
            yield next(iter(chunks(record)))
            raise OSError("disk full")

        return generate()

    monkeypatch.setattr(recorder, "chunks", failing)


@pytest.mark.parametrize("failure", [_fail_fsync, _fail_mid_stream], ids=_name)
@pytest.mark.parametrize("recorder_type", FILE_RECORDERS, ids=_name)
def test_a_failed_save_leaves_the_old_file_and_no_temporary(recorder_type, failure, tmp_path,
                                                            monkeypatch):
    recorder = recorder_type()
    path = recorder.save({"version": "old"}, tmp_path / "model")
    before = path.read_bytes()
    failure(monkeypatch, recorder)
    with pytest.raises(OSError, match="disk full"):
        recorder.save({"version": "new", "w": TensorData(np.ones(100_000, np.float32))}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert list(tmp_path.iterdir()) == [path]
    assert recorder.load(path) == {"version": "old"}


def test_an_unsavable_record_fails_before_any_file_is_created(tmp_path):
    with pytest.raises(RecordError):
        NamedMpkFileRecorder().save({"w": object()}, tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------ errors
def _saved(recorder, tmp_path, record=None):
    record = sample_record() if record is None else record
    if isinstance(recorder, BinBytesRecorder):
        path = tmp_path / "record.bytes"
        path.write_bytes(recorder.to_bytes(record))
        return path
    return recorder.save(record, tmp_path / "record")


def _load(recorder, path: Path):
    if isinstance(recorder, BinBytesRecorder):
        return recorder.from_bytes(path.read_bytes(), source=str(path))
    return recorder.load(path)


@pytest.mark.parametrize("keep", [0.5, -1, -9], ids=["half", "last-byte", "last-9-bytes"])
@pytest.mark.parametrize("recorder_type", RECORDERS, ids=_name)
def test_a_truncated_file_is_a_format_error(recorder_type, keep, tmp_path):
    recorder = recorder_type()
    path = _saved(recorder, tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep) if keep > 0 else keep])
    with pytest.raises(RecordFormatError, match="truncated") as info:
        _load(recorder, path)
    assert info.value.file == str(path) and str(path) in str(info.value)


@pytest.mark.parametrize("where", [0.5, -6], ids=["deflate-data", "crc"])
@pytest.mark.parametrize("recorder_type", GZIP_RECORDERS, ids=_name)
def test_a_bit_flip_in_gzip_data_is_caught(recorder_type, where, tmp_path):
    recorder = recorder_type()
    path = _saved(recorder, tmp_path)
    data = bytearray(path.read_bytes())
    data[int(len(data) * where) if where > 0 else where] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(RecordFormatError, match="corrupt gzip data") as info:
        recorder.load(path)
    assert info.value.file == str(path)


def _kind(recorder_type):
    return "bin" if recorder_type is BinBytesRecorder else EXTENSIONS[recorder_type]


WRONG_PAIRS = [(w, r) for w in RECORDERS for r in RECORDERS if _kind(w) != _kind(r)]


@pytest.mark.parametrize(("writer", "reader"), WRONG_PAIRS,
                         ids=[f"{_name(w)}-read-by-{_name(r)}" for w, r in WRONG_PAIRS])
def test_a_file_of_another_recorder_names_both_formats(writer, reader, tmp_path):
    path = _saved(writer(), tmp_path, {"w": TensorData([1.0], "f32")})
    with pytest.raises(RecordFormatError) as info:
        _load(reader(), path)
    message = str(info.value)
    writer_name = "BinFileRecorder" if writer is BinBytesRecorder else writer.__name__
    assert f"{path} was written by {writer_name} ({_kind(writer)})" in message
    assert f"not loaded with {reader.__name__} ({_kind(reader)})" in message
    assert info.value.file == str(path)


@pytest.mark.parametrize(("content", "expected"), [
    (b"", "is empty"),
    (b"PK\x03\x04rest of a zip", "PyTorchFileRecorder"),
    (struct.pack("<Q", 19) + b'{"__metadata__":{}}', "safetensors"),
    (b"\x00\x01garbage", "unrecognized data starting with"),
    (zlib.compress(b"hello", wbits=31), "gzip data holding unrecognized data"),
])
def test_a_file_of_unknown_content_says_what_it_is(content, expected, tmp_path):
    path = tmp_path / "x.mpk"
    path.write_bytes(content)
    with pytest.raises(RecordFormatError, match=expected) as info:
        NamedMpkFileRecorder().load(path)
    assert f"{path} is not in NamedMpkFileRecorder's format (mpk): it is " in str(info.value)


# Corruptions of a well-formed file's top map, each applied through the format's own encoding.
def _tensor(top):
    return top["record"]["w"]["$tensor"]


CORRUPTIONS = {
    "wrong-nbytes": (lambda top: _tensor(top).update(shape=[4]), "needs 16 bytes|needs 4"),
    "unknown-dtype": (lambda top: _tensor(top).update(dtype="f8"), "unknown dtype 'f8'"),
    "newer-version": (lambda top: top.update(version=2), "newer ember .format version 2"),
    "unknown-tag": (lambda top: top["record"].update(x={"$weird": 1}), "unknown tag '.weird'"),
    "missing-field": (lambda top: _tensor(top).pop("dtype"), "must have the fields"),
}


def _rewrite(recorder_type, data: bytes, edit) -> bytes:
    """``data`` with its top map decoded by plain msgpack / json, edited and re-encoded."""
    if recorder_type is PrettyJsonFileRecorder:
        top = json.loads(data)
        edit(top)
        return json.dumps(top).encode()
    if recorder_type is NamedMpkFileRecorder:
        top = msgpack.unpackb(data, raw=False)
        edit(top)
        return msgpack.packb(top)
    _, index_nbytes, data_nbytes = struct.unpack_from("<8sQQ", data)
    start = -(-(24 + index_nbytes) // 64) * 64
    top = msgpack.unpackb(data[24:24 + index_nbytes], raw=False)
    edit(top)
    index = msgpack.packb(top)
    head = struct.pack("<8sQQ", b"EMBERBIN", len(index), data_nbytes) + index
    return head + bytes(-(-len(head) // 64) * 64 - len(head)) + data[start:]


@pytest.mark.parametrize("corruption", CORRUPTIONS)
@pytest.mark.parametrize("recorder_type", [NamedMpkFileRecorder, BinFileRecorder,
                                           PrettyJsonFileRecorder], ids=_name)
def test_corrupt_content_is_a_format_error_naming_file_and_path(recorder_type, corruption,
                                                                 tmp_path):
    edit, message = CORRUPTIONS[corruption]
    recorder = recorder_type()
    path = recorder.save({"w": TensorData([1.0, 2.0, 3.0], "f32")}, tmp_path / "m")
    path.write_bytes(_rewrite(recorder_type, path.read_bytes(), edit))
    with pytest.raises(RecordFormatError, match=message) as info:
        recorder.load(path)
    assert info.value.file == str(path) and str(info.value).startswith(str(path))
    if corruption in ("wrong-nbytes", "unknown-dtype", "missing-field"):
        assert info.value.path == "w" and "at record path w" in str(info.value)


def test_a_tensor_beyond_the_messagepack_bin_limit_names_its_path(monkeypatch):
    from ember.record import formats

    monkeypatch.setattr(formats, "_BIN_LIMIT", 16)
    record = {"a": [TensorData(np.ones(5, np.float32))]}
    with pytest.raises(RecordError, match=r"record path a\.0: a tensor of 20 bytes exceeds"):
        NamedMpkFileRecorder().to_bytes(record)
    assert BinBytesRecorder().from_bytes(BinBytesRecorder().to_bytes(record))["a"][0].shape == (5,)


def test_bin_tensor_outside_the_data_section(tmp_path):
    data = BinBytesRecorder().to_bytes({"w": TensorData([1.0], "f32")})
    data = _rewrite(BinFileRecorder, data, lambda top: _tensor(top).update(offset=64))
    with pytest.raises(RecordFormatError, match="outside the data section"):
        BinBytesRecorder().from_bytes(data)


@pytest.mark.parametrize("recorder_type", RECORDERS, ids=_name)
@pytest.mark.parametrize(("precision", "value", "bounds"), [
    (HalfPrecision, 40000, "[-32768, 32767]"),
    (BF16Precision, -40000, "[-32768, 32767]"),
    (FullPrecision, 2**40, "[-2147483648, 2147483647]"),
], ids=["half", "bf16", "full"])
def test_an_int_out_of_the_precision_range_names_the_path(recorder_type, precision, value,
                                                         bounds, tmp_path):
    record = {"encoder": {"layers": [{"weight": {"id": "1",
                                                 "param": TensorData([1, value], "i64")}}]}}
    with pytest.raises(RecordError) as info:
        recorder_type(precision).to_bytes(record)
    message = str(info.value)
    assert info.value.path == "encoder.layers.0.weight.param"
    assert "record path encoder.layers.0.weight.param" in message
    assert f"range from {min(1, value)} to {max(1, value)}" in message and bounds in message
    assert not isinstance(info.value, RecordFormatError)


class _Thing:
    pass


_cycle: dict = {"a": []}
_cycle["a"].append(_cycle)

UNSAVABLE = [
    ({"w": {"param": np.ones(3)}}, "w.param", "numpy.ndarray"),
    ({"w": [1, _Thing()]}, "w.1", "_Thing"),
    ({"w": np.float32(1.0)}, "w", "numpy.float32"),
    ({"w": {1: "x"}}, "w", "dict keys must be str, found 1 of type builtins.int"),
    ({"w": {3, 4}}, "w", "builtins.set"),
    ({"w": [2**64]}, "w.0", "int 18446744073709551616 is outside"),
    ({"w": "\ud800"}, "w", "not valid Unicode"),
    (_cycle, "a.0", "the record contains itself"),
]


@pytest.mark.parametrize("recorder_type", RECORDERS, ids=_name)
@pytest.mark.parametrize(("record", "path", "message"), UNSAVABLE,
                         ids=[u[2].split()[0] for u in UNSAVABLE])
def test_an_unsavable_value_names_its_path_and_type(recorder_type, record, path, message):
    with pytest.raises(RecordError) as info:
        recorder_type().to_bytes(record)
    assert info.value.path == path
    assert f"record path {path}: " in str(info.value) and message in str(info.value)


@pytest.mark.parametrize("recorder_type", FILE_RECORDERS, ids=_name)
def test_missing_file_and_missing_directory(recorder_type, tmp_path):
    recorder = recorder_type()
    extension = EXTENSIONS[recorder_type]
    with pytest.raises(RecordFileNotFoundError) as info:
        recorder.load(tmp_path / "absent")
    assert f"{tmp_path / 'absent'} or {tmp_path / 'absent'}.{extension}" in str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    missing = tmp_path / "no" / "such"
    with pytest.raises(RecordFileNotFoundError, match=re.escape(f"directory {missing} does not exist")):
        recorder.save({"x": 1}, missing / "model")
    assert list(tmp_path.iterdir()) == []
