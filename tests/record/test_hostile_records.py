"""Hostile record files: every crafted size, shape, type and gzip bomb fails with a typed
error naming the file, the record path and the value, before anything big is allocated;
loaded tensors are views that no later change to the file reaches; ember never writes what
it cannot read back."""

from __future__ import annotations

import json
import struct
import time
import zlib

import msgpack
import numpy as np
import pytest

import record_bombs
from ember import TensorData
from ember.backend.errors import ArgumentError, RecordError, RecordFormatError
from ember.record import limits
from ember.record.limits import MAX_DEPTH, content_limit, tensor_nbytes
from ember.record.recorder import (
    BinBytesRecorder,
    BinFileRecorder,
    BinGzFileRecorder,
    JsonGzFileRecorder,
    NamedMpkFileRecorder,
    NamedMpkGzFileRecorder,
    PrettyJsonFileRecorder,
)

PLAIN = [NamedMpkFileRecorder, BinFileRecorder, PrettyJsonFileRecorder]
GZIP = [NamedMpkGzFileRecorder, BinGzFileRecorder, JsonGzFileRecorder]
ALL = PLAIN + GZIP


def _name(value):
    return getattr(value, "__name__", None) or repr(value)


# ------------------------------------------------------------------ crafting files
def _decode_top(recorder, data: bytes):
    """The top map of ``data`` as plain msgpack / json read it, and the Bin data section."""
    if recorder.compressed:
        data = zlib.decompress(data, 31)
    kind = recorder.encoding.extension
    if kind == "json":
        return json.loads(data), b""
    if kind == "mpk":
        return msgpack.unpackb(data, raw=False), b""
    _, index_nbytes, _ = struct.unpack_from("<8sQQ", data)
    start = -(-(24 + index_nbytes) // 64) * 64
    return msgpack.unpackb(data[24:24 + index_nbytes], raw=False), data[start:]


def _encode_top(recorder, top, section: bytes = b"", index: bytes | None = None) -> bytes:
    kind = recorder.encoding.extension
    if kind == "json":
        data = json.dumps(top).encode()
    elif kind == "mpk":
        data = msgpack.packb(top) if index is None else index
    else:
        index = msgpack.packb(top) if index is None else index
        head = struct.pack("<8sQQ", b"EMBERBIN", len(index), len(section)) + index
        data = head + bytes(-len(head) % 64) + section
    return zlib.compress(data, 1, 31) if recorder.compressed else data


def _crafted(recorder_type, edit, record=None):
    """A valid file of ``record`` with its top map edited by ``edit(top)``."""
    recorder = recorder_type()
    record = {"w": TensorData([1.0, 2.0, 3.0], "f32")} if record is None else record
    top, section = _decode_top(recorder, recorder.to_bytes(record))
    edit(top)
    return _encode_top(recorder, top, section)


def _load(recorder_type, data: bytes, tmp_path, **options):
    path = tmp_path / ("crafted." + recorder_type.extension)
    path.write_bytes(data)
    return recorder_type(**options).load(path), str(path)


def _refused(recorder_type, data: bytes, tmp_path, match: str, **options) -> RecordFormatError:
    path = tmp_path / ("crafted." + recorder_type.extension)
    path.write_bytes(data)
    with pytest.raises(RecordFormatError, match=match) as info:
        recorder_type(**options).load(path)
    assert info.value.file == str(path) and str(info.value).startswith(str(path))
    return info.value


def _payload(top):
    return top["record"]["w"]["$tensor"]


# ------------------------------------------------------------------ shapes and sizes
BAD_SHAPES = {
    "negative": ([3, -1], r"negative dimension -1"),
    "float": ([1.5], r"dimension 1\.5 that is not an int"),
    "string": (["3"], r"dimension '3' that is not an int"),
    "bool": ([True], r"dimension True that is not an int"),
    "null": ([None], r"dimension None that is not an int"),
    "nested": ([[3]], r"dimension \[3\] that is not an int"),
    "not-a-list": ("3", r"a shape must be a list of dimensions, got '3'"),
    "a-map": ({"0": 3}, r"a shape must be a list of dimensions"),
    "product-overflows": ([2**40, 2**40], r"describes more than 2\*\*63 bytes"),
    "zero-size-beyond-numpy": ([0, 2**63], r"describes more than 2\*\*63 bytes"),
    "too-many-dims": ([1] * 65, r"65 dimensions, more than 64"),
}


@pytest.mark.parametrize("shape", BAD_SHAPES)
@pytest.mark.parametrize("recorder_type", PLAIN, ids=_name)
def test_a_shape_no_tensor_can_have_names_path_and_value(recorder_type, shape, tmp_path):
    value, message = BAD_SHAPES[shape]
    data = _crafted(recorder_type, lambda top: _payload(top).update(shape=value))
    error = _refused(recorder_type, data, tmp_path, message)
    assert error.path == "w" and "at record path w" in str(error)


@pytest.mark.parametrize("recorder_type", PLAIN, ids=_name)
@pytest.mark.parametrize("shape", [[10**10], [2**30, 2**30], [2**60], [3, 2**40]],
                         ids=["1e10", "2^60-elements", "2^60", "3x2^40"])
def test_a_huge_declared_tensor_allocates_nothing(recorder_type, shape, tmp_path):
    # A consistent lie for Bin (nbytes agrees with the shape): only the data is missing.
    def edit(top):
        _payload(top).update(shape=shape)
        if "nbytes" in _payload(top):
            _payload(top)["nbytes"] = tensor_nbytes(shape, 4)

    start = time.perf_counter()
    error = _refused(recorder_type, _crafted(recorder_type, edit), tmp_path,
                     "needs|lie outside")
    assert time.perf_counter() - start < 1 and error.path == "w"


def test_tensor_nbytes_is_exact_beyond_64_bits():
    assert tensor_nbytes([2**31, 2**31], 1) == 2**62
    assert tensor_nbytes([0, 2**60], 4) == 0
    assert tensor_nbytes((), 8) == 8
    with pytest.raises(limits.SizeError, match="more than 2"):
        tensor_nbytes([2**31, 2**32], 2)  # exactly 2**64


BIN_LIES = {
    "misaligned": ({"offset": 4}, r"offset 4 is not a multiple of 64"),
    "negative-offset": ({"offset": -64}, r"\[-64, \+12\) lie outside the data section"),
    "beyond-the-section": ({"offset": 64}, r"\[64, \+12\) lie outside the data section"),
    "huge-offset": ({"offset": 2**64 - 64}, r"lie outside the data section"),
    "float-offset": ({"offset": 0.0}, r"tensor offset 0\.0 is not a multiple of 64"),
    "nbytes-mismatch": ({"nbytes": 8}, r"tensor nbytes is 8, shape \[3\] of f32 needs 12"),
    "nbytes-a-string": ({"nbytes": "12"}, r"tensor nbytes is '12'"),
    "nbytes-bytes": ({"nbytes": b"\x0c"}, r"tensor nbytes is b'\\x0c'"),
}


@pytest.mark.parametrize("lie", BIN_LIES)
def test_bin_offsets_and_sizes_are_checked(lie, tmp_path):
    change, message = BIN_LIES[lie]
    data = _crafted(BinFileRecorder, lambda top: _payload(top).update(change))
    assert _refused(BinFileRecorder, data, tmp_path, message).path == "w"


def test_bin_tensors_may_not_overlap(tmp_path):
    record = {"a": TensorData(np.arange(16), "f32"), "b": TensorData(np.arange(16), "f32")}
    data = _crafted(BinFileRecorder, lambda top: top["record"]["b"]["$tensor"].update(offset=0),
                    record)
    error = _refused(BinFileRecorder, data, tmp_path, r"overlap those of a \[0, 64\)")
    assert error.path == "b"
    # Two empty tensors at one offset share no byte.
    record = {"a": TensorData(np.zeros(0), "f32"), "b": TensorData(np.zeros(0), "f32")}
    loaded, _ = _load(BinFileRecorder, BinFileRecorder().to_bytes(record), tmp_path)
    assert loaded["a"].shape == loaded["b"].shape == (0,)


@pytest.mark.parametrize(("header", "message"), [
    ((2**64 - 1, 0), r"truncated: the Bin index of 18446744073709551615 bytes"),
    ((10, 2**64 - 1), r"truncated: the Bin index of 10 bytes and data section of "
                      r"18446744073709551615 bytes at byte 24 needs"),
    ((0, 0), r"\d+ unexpected bytes after the end of the data \(at byte 64\)"),
], ids=["huge-index", "huge-data", "shorter-than-the-file"])
def test_bin_header_sizes_are_checked_against_the_file(header, message, tmp_path):
    data = bytearray(BinFileRecorder().to_bytes({"w": TensorData([1.0], "f32")}))
    struct.pack_into("<QQ", data, 8, *header)
    _refused(BinFileRecorder, bytes(data), tmp_path, message)


# ------------------------------------------------------------------ types at every level
def _set(path, value):
    def edit(top):
        node = top
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


WRONG_TYPES = {
    "record-is-a-str": (lambda top: top.update(record="x"), None),
    "top-is-a-list": (None, r"is not in \w+'s format|expected a top map with format"),
    "format-is-a-list": (_set(["format"], ["ember"]), r"is not in \w+'s format|expected a top map"),
    "version-is-a-str": (_set(["version"], "1"), r"bad format version '1'"),
    "version-is-a-float": (_set(["version"], 1.0), r"bad format version 1\.0"),
    "precision-name-is-an-int": (_set(["precision", "name"], 3), r"lacks ember_version"),
    "precision-is-a-list": (_set(["precision"], ["full"]), r"lacks ember_version"),
    "tensor-is-a-list": (_set(["record", "w", "$tensor"], [1, 2]), r"must have the fields"),
    "dtype-is-an-int": (_set(["record", "w", "$tensor", "dtype"], 4), r"unknown dtype 4"),
    "dtype-is-a-list": (_set(["record", "w", "$tensor", "dtype"], list(range(10**5))),
                        r"unknown dtype \[0, 1, 2, 3, 4, 5, 6, 7, \.\.\.\] \(100000 items\)"),
    "unknown-dtype": (_set(["record", "w", "$tensor", "dtype"], "f128"), r"unknown dtype 'f128'"),
    "extra-field": (lambda top: _payload(top).update(extra=1), r"must have the fields"),
    "unknown-tag": (_set(["record", "$weird"], 1), r"unknown tag '\$weird'"),
    "float-tag-not-a-name": (_set(["record", "x"], {"$float": "NaNa"}), r'expected "nan"'),
    "bytes-tag-not-base64": (_set(["record", "x"], {"$bytes": "@@"}), r"expected base64 text"),
    "bytes-tag-a-list": (_set(["record", "x"], {"$bytes": [1]}), r"expected base64 text"),
}


@pytest.mark.parametrize("case", WRONG_TYPES)
@pytest.mark.parametrize("recorder_type", PLAIN, ids=_name)
def test_a_value_of_the_wrong_type_anywhere_is_a_format_error(recorder_type, case, tmp_path):
    edit, message = WRONG_TYPES[case]
    if edit is None:  # the top itself replaced
        recorder = recorder_type()
        _, section = _decode_top(recorder, recorder.to_bytes({}))
        data = _encode_top(recorder, ["ember"], section)
        _refused(recorder_type, data, tmp_path, message)
        return
    data = _crafted(recorder_type, edit)
    if message is None:  # a record may be any value: a str loads as itself
        assert _load(recorder_type, data, tmp_path)[0] == "x"
        return
    _refused(recorder_type, data, tmp_path, message)


@pytest.mark.parametrize("recorder_type", [NamedMpkFileRecorder, BinFileRecorder], ids=_name)
def test_messagepack_tensor_fields_of_the_wrong_type(recorder_type, tmp_path):
    field = "data" if recorder_type is NamedMpkFileRecorder else "nbytes"
    for value, shown in [("abc", "'abc'"), (12.0, "12.0"), ([1, 2], r"\[1, 2\]"),
                         (None, "None")]:
        data = _crafted(recorder_type, _set(["record", "w", "$tensor", field], value))
        _refused(recorder_type, data, tmp_path, shown)


# ------------------------------------------------------------------ MessagePack itself
def _mpk_file(body: bytes) -> bytes:
    """A Named MessagePack file whose ``record`` value is the raw MessagePack ``body``."""
    head = msgpack.packb({"format": "ember.named-mpk", "version": 1, "ember_version": "0.1.0",
                          "precision": {"name": "full", "float": "f32", "int": "i32"},
                          "record": None})
    assert head.endswith(b"\xc0")
    return head[:-1] + body


MPK_CASES = {
    "ext-type": (b"\xd4\x01\x00", r"MessagePack extension type \(byte 0xd4\)"),
    "timestamp": (b"\xd6\xff\x00\x00\x00\x00", r"extension type \(byte 0xd6\)"),
    "never-used-byte": (b"\xc1", r"byte 0xc1 at byte \d+ is no MessagePack type"),
    "bad-utf8": (b"\xa2\xc3\x28", r"the string at byte \d+ is not UTF-8"),
    "surrogate": (b"\xa3\xed\xa0\x80", r"is not UTF-8"),
    "int-key": (b"\x81\x01\xc0", r"a map key must be a str, found an int at byte \d+"),
    "bin-key": (b"\x81\xc4\x01k\xc0", r"a map key must be a str, found a byte string"),
    "list-key": (b"\x81\xdd\xff\xff\xff\xff", r"a map key must be a str, found an array"),
    "float-key": (b"\x81\xcb" + bytes(8) + b"\xc0", r"must be a str, found a float"),
    "repeated-key": (b"\x82\xa1k\x01\xa1k\x02", r"the key 'k' appears twice"),
    "huge-array": (b"\xdd\xff\xff\xff\xff\xc0", r"an array of 4294967295 entries .*needs at "
                                               r"least 4294967295"),
    "huge-map": (b"\xdf\xff\xff\xff\xff", r"a map of 4294967295 entries"),
    "huge-bin": (b"\xc6\xff\xff\xff\xff", r"truncated: a byte string at byte \d+ needs"),
    "huge-str": (b"\xdb\xff\xff\xff\xff", r"truncated: a string at byte"),
    "truncated-int": (b"\xcf\x00", r"truncated: a value at byte"),
    "trailing-bytes": (b"\xc0\xc0\xc0", r"2 unexpected bytes after the end"),
    "deep": (b"\x91" * 100_000 + b"\xc0", rf"nested deeper than {MAX_DEPTH} levels"),
    "deep-maps": (b"\x81\xa1k" * 100_000 + b"\xc0", rf"nested deeper than {MAX_DEPTH} levels"),
}


@pytest.mark.parametrize("case", MPK_CASES)
def test_malformed_messagepack_is_a_format_error(case, tmp_path):
    body, message = MPK_CASES[case]
    _refused(NamedMpkFileRecorder, _mpk_file(body), tmp_path, message)


def test_messagepack_errors_name_the_record_path(tmp_path):
    body = b"\x81\xa6layers\x92\xc0\x81\xa1w\xc1"  # {"layers": [nil, {"w": <0xc1>}]}
    error = _refused(NamedMpkFileRecorder, _mpk_file(body), tmp_path, "0xc1")
    assert error.path == "layers.1.w" and "at record path layers.1.w" in str(error)


def test_nesting_up_to_the_limit_round_trips_and_deeper_is_refused_when_saving(tmp_path):
    deep = None
    for _ in range(MAX_DEPTH - 1):  # the record map itself is the first level
        deep = [deep]
    for recorder_type in ALL:
        path = recorder_type().save({"x": deep}, tmp_path / "deep")
        assert recorder_type().load(path) == {"x": deep}
    with pytest.raises(RecordError, match=rf"x(\.0)+: dicts and lists nested deeper than "
                                          rf"{MAX_DEPTH}"):
        NamedMpkFileRecorder().to_bytes({"x": [deep]})


# ------------------------------------------------------------------ JSON
JSON_CASES = {
    "nan-literal": (b'{"format": "ember.json", "x": NaN}', r"NaN is not JSON"),
    "infinity-literal": (b'{"format": "ember.json", "x": -Infinity}', r"-Infinity is not JSON"),
    "not-utf8": (b'{"format": "ember.json", "x": "\xff"}', r"not UTF-8 \(invalid start byte"),
    "deep": (b'{"format": "ember.json", "x": ' + b"[" * 100_000, r"truncated or corrupt"),
    "deep-below-json-limit": (
        b'{"format": "ember.json", "version": 1, "ember_version": "0", "precision": '
        b'{"name": "full", "float": "f32", "int": "i32"}, "record": ' + b"[" * 150 + b"]" * 150
        + b"}", rf"nested deeper than {MAX_DEPTH} levels"),
    "huge-int": (b'{"format": "ember.json", "x": ' + b"9" * 5000 + b"}", r"truncated or corrupt"),
}


@pytest.mark.parametrize("case", JSON_CASES)
def test_malformed_json_is_a_format_error(case, tmp_path):
    data, message = JSON_CASES[case]
    _refused(PrettyJsonFileRecorder, data, tmp_path, message)


@pytest.mark.parametrize(("values", "dtype", "message"), [
    ([1, "x", 3], "f32", "bad f32 tensor values"),
    ([[1], [2], [3]], "f32", "not a flat list"),
    ([1, 2, 10**30], "i64", "bad i64 tensor values|not a flat list"),
    ([1, 2, 300], "u8", "not a flat list of u8"),
    ([1, 0, 1], "bool", "not a flat list of bool"),
    ([1.5, 2, 3], "i32", "not a flat list of i32"),
    ([{}, 2, 3], "f32", "bad f32 tensor values"),
    ("abc", "f32", "tensor holds 'abc', shape \\[3\\] needs 3"),
], ids=["str-in-floats", "nested", "huge-int", "u8-range", "ints-for-bools", "float-in-ints",
        "map", "not-a-list"])
def test_json_tensor_values_of_the_wrong_kind(values, dtype, message, tmp_path):
    def edit(top):
        _payload(top).update(values=values, dtype=dtype)

    error = _refused(PrettyJsonFileRecorder, _crafted(PrettyJsonFileRecorder, edit), tmp_path,
                     message)
    assert error.path == "w"


# ------------------------------------------------------------------ gzip bombs and limits
def test_the_default_content_limit(monkeypatch):
    monkeypatch.delenv(limits.MAX_BYTES_VARIABLE, raising=False)
    assert content_limit(None) is None
    assert content_limit(1000) == 256 << 20  # the floor
    assert content_limit(10 << 20) == 256 * (10 << 20)
    assert content_limit(10 << 20, max_bytes=5) == 5
    monkeypatch.setenv(limits.MAX_BYTES_VARIABLE, "1_000")
    assert content_limit(10 << 20) == content_limit(None) == 1000
    assert content_limit(None, max_bytes=7) == 7  # the argument wins
    for bad in ("-5", "lots", "1e9", "0"):
        monkeypatch.setenv(limits.MAX_BYTES_VARIABLE, bad)
        with pytest.raises(ArgumentError, match="EMBER_RECORD_MAX_BYTES"):
            content_limit(100)


@pytest.mark.parametrize("max_bytes", [0, -1, 1.5, "10", True])
def test_max_bytes_must_be_a_positive_int(max_bytes):
    with pytest.raises(ArgumentError, match="max_bytes must be a positive number of bytes"):
        NamedMpkGzFileRecorder(max_bytes=max_bytes)


def test_ember_writes_gzip_that_inflates_less_than_the_ratio_it_allows(tmp_path):
    # The default limit must never refuse a file ember wrote: its worst case is all zeros.
    path = NamedMpkGzFileRecorder().save({"w": TensorData(np.zeros(1 << 22), "f32")},
                                         tmp_path / "zeros")
    inflated = len(zlib.decompress(path.read_bytes(), 31))
    assert inflated / path.stat().st_size < limits.GZIP_RATIO
    assert NamedMpkGzFileRecorder(max_bytes=256 * path.stat().st_size).load(path)["w"].shape == (
        1 << 22,)


BOMB_CASES = [(kind, build) for kind, builds in record_bombs.BOMBS.items() for build in builds]
_BOMB_ERRORS = {
    "mpk_declared": r"needs \d+ bytes, beyond the content limit of 1048576 bytes for this gzip "
                    r"file; if the file is trusted, raise the limit .* at record path "
                    r"w\.\$tensor\.data",
    "bin_declared": r"needs \d+ bytes, beyond the content limit of 1048576",
    "mpk_trailing": r"unexpected data after the end of the content",
    "bin_trailing": r"unexpected data after the end of the content",
    "json_values": r"inflates to more than the content limit of 1048576",
    "json_spaces": r"inflates to more than the content limit of 1048576",
    "raw_zeros": r"is not in \w+'s format .*: it is gzip data holding unrecognized data",
}


@pytest.mark.parametrize(("kind", "build"), BOMB_CASES,
                         ids=[f"{k}-{b.__name__}" for k, b in BOMB_CASES])
def test_a_gzip_bomb_fails_fast_at_the_limit(kind, build, tmp_path):
    recorder_type = {r.extension: r for r in GZIP}[kind]
    path = tmp_path / f"bomb.{kind}"
    path.write_bytes(build(64 << 20))  # 64 MiB inside ~70 KB
    start = time.perf_counter()
    with pytest.raises(RecordFormatError, match=_BOMB_ERRORS[build.__name__]) as info:
        recorder_type(max_bytes=1 << 20).load(path)
    assert time.perf_counter() - start < 2 and info.value.file == str(path)


@pytest.mark.parametrize("kind", ["mpk.gz", "bin.gz"])
def test_an_all_zero_record_loads_up_to_the_limit_it_declares(kind, tmp_path, monkeypatch):
    recorder_type = {r.extension: r for r in GZIP}[kind]
    build = record_bombs.BOMBS[kind][0]
    path = tmp_path / f"zeros.{kind}"
    path.write_bytes(build(8 << 20))  # 8 MiB of zeros in ~9 KB: ratio ~900
    record = recorder_type(max_bytes=9 << 20).load(path)
    assert record["w"].shape == (8 << 20,) and not record["w"].to_numpy().any()
    with pytest.raises(RecordFormatError, match="beyond the content limit of 8388608"):
        recorder_type(max_bytes=8 << 20).load(path)
    monkeypatch.setenv(limits.MAX_BYTES_VARIABLE, str(9 << 20))
    assert recorder_type().load(path)["w"].shape == (8 << 20,)


def test_too_many_values_for_the_limit(tmp_path):
    record = {"x": list(range(2000))}
    for recorder_type in GZIP:
        path = recorder_type().save(record, tmp_path / "values")
        assert recorder_type(max_bytes=2100 * 64).load(path) == record
        with pytest.raises(RecordFormatError, match=r"more (values )?than the content limit "
                                                    r"allows"):
            recorder_type(max_bytes=1000 * 64).load(path)


def test_an_explicit_limit_bounds_uncompressed_files_too(tmp_path):
    path = NamedMpkFileRecorder().save({"w": TensorData(np.zeros(1000), "f32")}, tmp_path / "m")
    with pytest.raises(RecordFormatError, match="more than the content limit of 1000"):
        NamedMpkFileRecorder(max_bytes=1000).load(path)
    data = path.read_bytes()
    with pytest.raises(RecordFormatError, match="more than the content limit of 1000"):
        NamedMpkFileRecorder(max_bytes=1000).from_bytes(data)
    assert NamedMpkFileRecorder(max_bytes=len(data)).from_bytes(data)["w"].shape == (1000,)


@pytest.mark.parametrize("kind", list(record_bombs.BOMBS))
def test_a_4gb_bomb_costs_little_memory(kind, tmp_path):
    """The real thing, each format's worst bomb, in a fresh interpreter: peak RSS stays far
    below the 4 GB (the JSON ones inflate up to the limit, set low here; see
    benchmarks/record_bombs.py for the default limit)."""
    for build in record_bombs.BOMBS[kind][:2]:
        path = tmp_path / f"{build.__name__}.{kind}"
        path.write_bytes(build(2**32 - 1))
        result = record_bombs.measure(path, kind, max_bytes=32 << 20)
        assert result["error"] == "RecordFormatError", result
        assert result["peak_growth"] < 100 << 20, result
        assert result["seconds"] < 5, result


# ------------------------------------------------------------------ what loading hands out
@pytest.mark.parametrize("recorder_type", ALL, ids=_name)
def test_loaded_tensors_do_not_change_when_the_file_does(recorder_type, tmp_path):
    weights = np.arange(40_000, dtype=np.float32)
    path = recorder_type().save({"w": TensorData(weights)}, tmp_path / "m")
    loaded = recorder_type().load(path)["w"]
    size = path.stat().st_size
    with open(path, "r+b") as file:  # overwritten in place, then truncated
        file.write(b"\xff" * size)
        file.truncate(10)
    np.testing.assert_array_equal(loaded.to_numpy(), weights)
    assert not loaded.buffer().flags.writeable


def test_from_bytes_copies_a_mutable_buffer(tmp_path):
    data = bytearray(BinBytesRecorder().to_bytes({"w": TensorData(np.ones(64), "f32")}))
    loaded = BinBytesRecorder().from_bytes(data)["w"]
    data[-256:] = bytes(256)
    np.testing.assert_array_equal(loaded.to_numpy(), np.ones(64))


@pytest.mark.parametrize("recorder_type", [NamedMpkFileRecorder, BinFileRecorder], ids=_name)
def test_loaded_tensors_are_aligned_views(recorder_type, tmp_path):
    record = {f"t{i}": TensorData(np.arange(i + 1), dtype)
              for i, dtype in enumerate(["f64", "f32", "f16", "i64", "i32", "u8", "bool"] * 3)}
    record["big"] = TensorData(np.arange(100_000), "f32")
    loaded = recorder_type().load(recorder_type().save(record, tmp_path / "m"))
    for key, value in record.items():
        array = loaded[key].buffer()
        assert array.flags.aligned and not array.flags.writeable, key
        np.testing.assert_array_equal(array, value.to_numpy())
    if recorder_type is BinFileRecorder:  # Bin aligns every tensor: all are views
        assert all(loaded[key].buffer().base is not None for key in record)


def test_running_out_of_memory_is_a_record_error_naming_the_file(tmp_path, monkeypatch):
    from ember.record import content

    path = BinFileRecorder().save({"w": TensorData(np.ones(8), "f32")}, tmp_path / "m")

    def exhausted(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(content, "aligned_empty", exhausted)
    with pytest.raises(RecordError, match="not enough memory to load the record") as info:
        BinFileRecorder().load(path)
    assert info.value.file == str(path) and not isinstance(info.value, MemoryError)
