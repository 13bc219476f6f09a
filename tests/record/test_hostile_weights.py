"""Hostile weight files: each crafted .pt / .safetensors fails with a typed error that names
the file, the tensor and the offending value, within memory bounded by the file's bytes, and
a seeded fuzz of mutated files written by torch.save and safetensors never escapes as a raw
exception (and agrees with torch.load and the safetensors library wherever both load)."""

from __future__ import annotations

import collections
import io
import json
import math
import pickle
import pickletools
import random
import struct
import subprocess
import sys
import time
import warnings
import zipfile
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import ember
from ember import TensorData
from ember.backend.errors import EmberError, RecordFormatError, UnsafePickleError
from ember.record import ImportedRecord, PyTorchFileRecorder, SafetensorsFileRecorder
from ember.record.pytorch import read_pytorch
from ember.record.safetensors import read_safetensors
from ember.record.weight_limits import WeightLimits

torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors")
st_torch = pytest.importorskip("safetensors.torch")

LAYOUTS = ["zip", "legacy"]
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
SRC = str(Path(ember.__file__).parents[1])  # subprocesses import this same ember
MIB = 1 << 20


# ------------------------------------------------------------------ crafting .pt files
class Storage:
    """A storage reference as torch.save pickles it: ("storage", type, key, location, numel)."""

    def __init__(self, key="0", numel=4, kind=None, legacy=False):
        self.key, self.numel, self.kind, self.legacy = (
            key,
            numel,
            kind or torch.FloatStorage,
            legacy,
        )


class Tensor:
    """A ``torch._utils._rebuild_tensor_v2`` call with any arguments at all."""

    def __init__(self, storage, offset=0, size=(4,), stride=(1,)):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride


class Crafter(pickle.Pickler):
    """Pickles Storage and Tensor with the very globals and persistent ids torch.save writes."""

    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            pid = ("storage", obj.kind, obj.key, "cpu", obj.numel)
            return (*pid, None) if obj.legacy else pid
        return None

    def reducer_override(self, obj):
        if isinstance(obj, Tensor):
            args = (obj.storage, obj.offset, obj.size, obj.stride, False, collections.OrderedDict())
            return torch._utils._rebuild_tensor_v2, args
        return NotImplemented


def crafted_pickle(obj) -> bytes:
    buffer = io.BytesIO()
    Crafter(buffer, protocol=2).dump(obj)
    return buffer.getvalue()


def write_zip(path: Path, pickled: bytes, storages: dict, *, compression=zipfile.ZIP_STORED,
              prefix="archive", names=None) -> Path:  # fmt: skip
    """A torch-style zip: ``<prefix>/data.pkl``, ``<prefix>/data/<key>`` and the small entries."""
    entries = [(f"{prefix}/data.pkl", pickled), (f"{prefix}/byteorder", b"little"),
               *((f"{prefix}/data/{key}", data) for key, data in storages.items()),
               (f"{prefix}/version", b"3\n")]  # fmt: skip
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w", compression) as archive:
        warnings.simplefilter("ignore")  # duplicate names, on purpose
        for name, data in names if names is not None else entries:
            archive.writestr(name, data)
    return path


def write_legacy(path: Path, obj, storages: list[tuple[str, int, bytes]], little=True) -> Path:
    """A legacy torch file: five pickles, then each storage as an element count and its bytes."""
    buffer = io.BytesIO()
    for part in (LEGACY_MAGIC, 1001, {"protocol_version": 1001, "little_endian": little}):
        pickle.dump(part, buffer, protocol=2)
    buffer.write(crafted_pickle(obj))
    pickle.dump([key for key, _, _ in storages], buffer, protocol=2)
    for _, count, data in storages:
        buffer.write(struct.pack("<q", count) + data)
    path.write_bytes(buffer.getvalue())
    return path


def write_pt(
    path: Path, layout: str, obj, data: dict[str, bytes], counts: dict | None = None
) -> Path:
    """``obj`` (holding Tensor and Storage) with storage bytes ``data`` by key, in ``layout``."""
    if layout == "zip":
        return write_zip(path, crafted_pickle(obj), data)
    counts = counts or {}
    return write_legacy(path, obj, [(k, counts.get(k, len(b) // 4), b) for k, b in data.items()])


def one_tensor(layout: str, offset=0, size=(4,), stride=(1,), numel=4, key="0", kind=None):
    storage = Storage(key, numel, kind, legacy=layout == "legacy")
    return {"w": Tensor(storage, offset, size, stride)}


FLOATS = np.arange(4, dtype=np.float32).tobytes()


# ------------------------------------------------------------------ hostile views and storages
HOSTILE_VIEWS = {  # name: (tensor arguments, what the message must quote)
    "negative size": (dict(size=(-1,)), "-1, outside [0, 9223372036854775807]"),
    "size past int64": (dict(size=(2**63,)), "9223372036854775808"),
    "float size": (dict(size=(1.5,)), "1.5, not an integer"),
    "None size": (dict(size=(None,)), "None, not an integer"),
    "string size": (dict(size=("3",)), "'3', not an integer"),
    "bool size": (dict(size=(True,)), "True, not an integer"),
    "size not a list": (dict(size=7), "shape is 7, not a list"),
    "negative stride": (dict(size=(2,), stride=(-1,)), "-1, outside"),
    "float stride": (dict(size=(2,), stride=(0.5,)), "0.5, not an integer"),
    "strides short": (dict(size=(2, 2), stride=(1,)), "stride [1] does not fit shape [2, 2]"),
    "negative offset": (dict(offset=-1), "storage offset is -1"),
    "float offset": (dict(offset=1.0), "storage offset is 1.0"),
    "None offset": (dict(offset=None), "storage offset is None"),
    "view past the storage": (dict(size=(5,)), "reach element 4 of a storage of 4"),
    "offset past the storage": (dict(offset=4, size=(1,)), "reach element 4 of a storage of 4"),
    "huge stride": (dict(size=(2,), stride=(10**18,)), "reach element 1000000000000000000"),
    "65 dimensions": (dict(size=(1,) * 65, stride=(1,) * 65), "65 dimensions, more than 64"),
    "empty but too large": (dict(size=(0, 2**62), stride=(1, 1)), "describes more than 2**63 bytes"),
    "10^10 elements by stride 0": (
        dict(size=(10**10,), stride=(0,)),
        "would take 40000000000 bytes",
    ),
    "10^20 by stride 0": (dict(size=(10**10, 10**10), stride=(0, 0)), "describes more than 2**63 bytes"),
    "10^15 by stride 0": (
        dict(size=(10**5, 10**10), stride=(0, 0)),
        "would take 4000000000000000 bytes",
    ),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", HOSTILE_VIEWS)
def test_hostile_views_name_file_tensor_and_value(tmp_path, layout, case):
    arguments, quoted = HOSTILE_VIEWS[case]
    path = write_pt(tmp_path / "w.pt", layout, one_tensor(layout, **arguments), {"0": FLOATS})
    with pytest.raises(RecordFormatError) as info:
        read_pytorch(path)
    message = str(info.value)
    assert message.startswith(f"{path}: w: ") and quoted in message
    assert info.value.file == str(path) and info.value.path == "w"


HOSTILE_STORAGES = {  # name: (storage arguments, what the message must quote)
    "10^10 elements in 16 bytes": (dict(numel=10**10), "declares 10000000000 x float32"),
    "negative count": (dict(numel=-1), "is -1, outside"),
    "float count": (dict(numel=4.0), "is 4.0, not an integer"),
    "None count": (dict(numel=None), "is None, not an integer"),
    "count past int64 bytes": (
        dict(numel=2**62),
        "byte count of storage '0' is 18446744073709551616",
    ),
    "key not a string": (dict(key=0), "a storage key is 0, not a string"),
    "type not a storage type": (dict(kind=torch.float32), "has no known element type"),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", HOSTILE_STORAGES)
def test_hostile_storage_declarations(tmp_path, layout, case):
    arguments, quoted = HOSTILE_STORAGES[case]
    path = write_pt(tmp_path / "w.pt", layout, one_tensor(layout, **arguments), {"0": FLOATS},
                    counts={"0": 4})  # fmt: skip
    with pytest.raises(RecordFormatError) as info:
        read_pytorch(path)
    if case == "10^10 elements in 16 bytes":  # found once the pickle is read: the tensor is named
        assert str(info.value).startswith(f"{path}: w: storage '0' ") and info.value.path == "w"
        if layout == "legacy":
            quoted = "holds 4 elements, its reference declares 10000000000"
    assert str(info.value).startswith(f"{path}: ") and quoted in str(info.value)


@pytest.mark.parametrize(("count", "quoted"), [
    (10**10, "holds 10000000000 elements, its reference declares 4"),
    (-1, "holds -1 elements"),
    (2**63 - 1, "holds 9223372036854775807 elements"),
])  # fmt: skip
def test_legacy_storage_counts_that_lie(tmp_path, count, quoted):
    path = write_pt(
        tmp_path / "w.pt", "legacy", one_tensor("legacy"), {"0": FLOATS}, counts={"0": count}
    )
    with pytest.raises(RecordFormatError, match=f": w: storage '0' {quoted}"):
        read_pytorch(path)


def test_legacy_truncated_storage_and_unknown_keys(tmp_path):
    obj = one_tensor("legacy", numel=1000)
    path = write_legacy(tmp_path / "w.pt", obj, [("0", 1000, FLOATS)])
    with pytest.raises(RecordFormatError, match="truncated: storage '0' needs 4000 bytes, 16 left"):
        read_pytorch(path)
    path = write_legacy(
        tmp_path / "w.pt", one_tensor("legacy"), [("0", 4, FLOATS), ("9", 4, FLOATS)]
    )
    with pytest.raises(RecordFormatError, match="storage '9' is listed but never used"):
        read_pytorch(path)
    path = write_legacy(
        tmp_path / "w.pt", one_tensor("legacy"), [("0", 4, FLOATS), ("0", 4, FLOATS)]
    )
    with pytest.raises(RecordFormatError, match="storage '0' is listed twice"):
        read_pytorch(path)


# ------------------------------------------------------------------ stride 0: expand() buffers
def save(obj, path: Path, layout: str) -> Path:
    torch.save(obj, path, _use_new_zipfile_serialization=layout == "zip")
    return path


@pytest.mark.parametrize("layout", LAYOUTS)
def test_expanded_buffers_load_as_torch_loads_them(tmp_path, layout):
    state = {
        "mask": torch.ones(1, 1).expand(4, 6),
        "positions": torch.arange(5.0).expand(3, 5),
        "column": torch.tensor([1, 2, 3]).reshape(3, 1).expand(3, 4),
        "overlapping": torch.arange(6.0).as_strided((3, 3), (1, 1)),
        "transposed": torch.arange(6.0).reshape(2, 3).t(),
    }
    path = save(state, tmp_path / "e.pt", layout)
    reference = torch.load(path, weights_only=True)
    tensors = read_pytorch(path)
    for name, value in reference.items():
        array = tensors[name].to_numpy()
        assert array.flags.c_contiguous and array.shape == tuple(value.shape)
        np.testing.assert_array_equal(array, value.numpy())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_expansion_past_the_limit_is_refused_until_the_user_raises_it(tmp_path, layout):
    path = save(
        {"big": torch.zeros(1).expand(1024, 1024)}, tmp_path / "b.pt", layout
    )  # 4 MiB of 4 bytes
    with pytest.raises(RecordFormatError) as info:
        read_pytorch(path, limits=WeightLimits(expanded_bytes=MIB))
    assert str(info.value).startswith(
        f"{path}: big: copying its view (shape [1024, 1024], stride [0, 0])"
    )
    assert "would take 4194304 bytes" in str(info.value) and "WeightLimits.expanded_bytes" in str(
        info.value
    )
    record = PyTorchFileRecorder(limits=WeightLimits(expanded_bytes=4 * MIB)).load(path)
    np.testing.assert_array_equal(
        record.tensors["big"].to_numpy(), np.zeros((1024, 1024), np.float32)
    )


def test_copies_of_one_storage_count_against_the_file(tmp_path):
    # 100 transposed views of one 64 KiB storage: each a copy, 6.4 MB from a 70 KB file
    storage = Storage("0", 128 * 128)
    obj = {f"t{i}": Tensor(storage, 0, (128, 128), (1, 128)) for i in range(100)}
    path = write_zip(tmp_path / "t.pt", crafted_pickle(obj), {"0": bytes(4 * 128 * 128)})
    with pytest.raises(
        RecordFormatError, match=r"t\d+: copying its view .* WeightLimits.expanded_bytes"
    ):
        read_pytorch(path, limits=WeightLimits(expanded_bytes=MIB))
    assert len(read_pytorch(path)) == 100  # within the default ceiling


# ------------------------------------------------------------------ peak memory, in a subprocess
RSS_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from ember.record.pytorch import read_pytorch
from ember.record.safetensors import read_safetensors

def status_kib(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))

outcomes, growth = [], []
for path in sys.argv[2:]:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets the peak (VmHWM) to the current RSS
    before = status_kib("VmRSS")
    try:
        result = (read_safetensors if path.endswith(".safetensors") else read_pytorch)(path)
        outcomes.append("loaded")
    except Exception as exc:
        outcomes.append(f"{type(exc).__name__}: {exc}")
    growth.append((status_kib("VmHWM") - before) / 1024)
    result = None
print(json.dumps({"outcomes": outcomes, "peak_growth_mib": growth}))
"""


def probe_peak_memory(paths: list[Path]) -> dict:
    """Reads each file in a fresh interpreter: how each ended, and how far above the RSS before
    the read its peak RSS went (in MiB)."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak RSS")
    done = subprocess.run([sys.executable, "-c", RSS_PROBE, SRC, *map(str, paths)],
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    return json.loads(done.stdout)


def expanded_control(tmp_path) -> Path:
    """A legitimate 1 KB file whose expand() buffer takes 48 MiB: shows the probe sees memory."""
    return save({"big": torch.zeros(1).expand(12 * MIB)}, tmp_path / "control.pt", "zip")


def test_huge_and_stride_0_storages_cost_no_memory(tmp_path):
    files = []
    for layout in LAYOUTS:
        for name, arguments in [("stride0", dict(size=(10**10,), stride=(0,))),
                                ("stride0-2d", dict(size=(10**5, 10**5), stride=(0, 0))),
                                ("huge", dict(numel=10**10, size=(10**10,)))]:  # fmt: skip
            files.append(
                write_pt(
                    tmp_path / f"{layout}-{name}.pt",
                    layout,
                    one_tensor(layout, **arguments),
                    {"0": FLOATS},
                    counts={"0": 4},
                )
            )
    assert all(f.stat().st_size < 2048 for f in files)
    result = probe_peak_memory([*files, expanded_control(tmp_path)])
    *growth, control = result["peak_growth_mib"]
    print(f"\npeak RSS growth on huge / stride-0 files: {max(growth):.2f} MiB "
          f"(control {control:.1f} MiB)")  # fmt: skip
    outcomes = result["outcomes"]
    assert all(o.startswith("RecordFormatError") for o in outcomes[:-1]), outcomes
    assert result["outcomes"][-1] == "loaded" and control > 40
    assert max(growth) < 4


# ------------------------------------------------------------------ zip-level attacks
def entry_offsets(data: bytes, name: str) -> tuple[int, int]:
    """The positions of ``name``'s central directory record and of its local header."""
    central = data.index(b"PK\x01\x02")  # the first record
    while True:
        name_length = struct.unpack("<H", data[central + 28 : central + 30])[0]
        if data[central + 46 : central + 46 + name_length] == name.encode():
            local = struct.unpack("<L", data[central + 42 : central + 46])[0]
            return central, local
        central = data.index(b"PK\x01\x02", central + 46)


def patch(data: bytes, at: int, fmt: str, value: int) -> bytes:
    return data[:at] + struct.pack(fmt, value) + data[at + struct.calcsize(fmt) :]


def small_zip(tmp_path, **kwargs) -> Path:
    obj = {"w": Tensor(Storage("0", 4)), "v": Tensor(Storage("1", 4))}
    return write_zip(
        tmp_path / "z.pt", crafted_pickle(obj), {"0": FLOATS, "1": FLOATS[::-1]}, **kwargs
    )


def test_deflated_entries_load_like_stored_ones(tmp_path):
    path = save({"w": torch.randn(3, 5), "i": torch.arange(7)}, tmp_path / "w.pt", "zip")
    with zipfile.ZipFile(path) as archive:
        members = [(n, archive.read(n)) for n in archive.namelist()]
    rezipped = write_zip(
        tmp_path / "deflated.pt", b"", {}, compression=zipfile.ZIP_DEFLATED, names=members
    )
    reference = torch.load(path, weights_only=True)
    for name, data in read_pytorch(rezipped).items():
        np.testing.assert_array_equal(data.to_numpy(), reference[name].numpy())


def test_a_zip_bomb_in_a_storage_is_refused_past_the_inflate_limit(tmp_path):
    numel = 16 * MIB // 4
    obj = {"w": Tensor(Storage("0", numel), size=(numel,))}
    path = write_zip(tmp_path / "bomb.pt", crafted_pickle(obj), {"0": bytes(16 * MIB)},
                     compression=zipfile.ZIP_DEFLATED)  # fmt: skip
    assert path.stat().st_size < 64 * 1024
    with pytest.raises(
        RecordFormatError, match=r"inflate to 167\d{5} bytes, more than WeightLimits.inflated_bytes"
    ):
        read_pytorch(path, limits=WeightLimits(inflated_bytes=8 * MIB))
    assert read_pytorch(path)["w"].shape == (numel,)  # declared honestly, within the default


def lying_bomb(tmp_path) -> Path:
    """A deflated entry that inflates to 256 MiB while its sizes and the pickle say 16 bytes."""
    obj = {"w": Tensor(Storage("0", 4))}
    path = write_zip(tmp_path / "liar.pt", crafted_pickle(obj), {"0": bytes(256 * MIB)},
                     compression=zipfile.ZIP_DEFLATED)  # fmt: skip
    data = path.read_bytes()
    central, local = entry_offsets(data, "archive/data/0")
    data = patch(patch(data, central + 24, "<L", 16), local + 22, "<L", 16)
    path.write_bytes(data)
    return path


def test_entry_sizes_that_lie(tmp_path):
    liar = lying_bomb(tmp_path)
    with pytest.raises(
        RecordFormatError, match=r"archive/data/0'? does not inflate|inflates to other"
    ):
        read_pytorch(liar)
    # a stored entry whose directory claims more bytes than the file has
    path = small_zip(tmp_path)
    data = path.read_bytes()
    central, _ = entry_offsets(data, "archive/data/1")
    path.write_bytes(patch(patch(data, central + 20, "<L", 10**9), central + 24, "<L", 10**9))
    with pytest.raises(
        RecordFormatError,
        match=r"storage '1' declares 4 x float32 = 16 bytes, its entry holds 1000000000",
    ):
        read_pytorch(path)
    # a directory that says deflated where the local header says stored
    path.write_bytes(patch(data, central + 10, "<H", 8))
    with pytest.raises(RecordFormatError, match="'archive/data/1' has no matching local header"):
        read_pytorch(path)
    # 16 KiB claimed from one compressed byte: more than deflate can make
    obj = {"w": Tensor(Storage("0", 4096), size=(4096,))}
    path = write_zip(tmp_path / "claim.pt", crafted_pickle(obj), {"0": bytes(16384)},
                     compression=zipfile.ZIP_DEFLATED)  # fmt: skip
    data = path.read_bytes()
    central, _ = entry_offsets(data, "archive/data/0")
    path.write_bytes(patch(data, central + 20, "<L", 1))
    with pytest.raises(
        RecordFormatError, match="claims 16384 bytes from 1 compressed, more than deflate can make"
    ):
        read_pytorch(path)


def test_a_lying_bomb_costs_no_memory(tmp_path):
    result = probe_peak_memory([lying_bomb(tmp_path), expanded_control(tmp_path)])
    bomb, control = result["peak_growth_mib"]
    print(
        f"\npeak RSS growth on a 256 MiB deflate bomb declared as 16 bytes: {bomb:.2f} MiB "
        f"(control {control:.1f} MiB)"
    )
    assert result["outcomes"][0].startswith("RecordFormatError") and control > 40
    assert bomb < 4


def test_overlapping_entries_are_refused(tmp_path):
    path = small_zip(tmp_path)
    data = path.read_bytes()
    _, local0 = entry_offsets(data, "archive/data/0")
    central1, _ = entry_offsets(data, "archive/data/1")
    path.write_bytes(patch(data, central1 + 42, "<L", local0))
    with pytest.raises(
        RecordFormatError, match=r"entries 'archive/data/0' and 'archive/data/1' overlap"
    ):
        read_pytorch(path)


@pytest.mark.parametrize(("names", "quoted"), [
    ([("archive/data.pkl", "p"), ("archive/data.pkl", "p")], "'archive/data.pkl' appears twice"),
    ([("../archive/data.pkl", "p")], "'../archive/data.pkl' is not a plain relative path"),
    ([("/archive/data.pkl", "p")], "'/archive/data.pkl' is not a plain relative path"),
    ([("archive\\data.pkl", "p")], "is not a plain relative path"),
    ([("a/data.pkl", "p"), ("b/data.pkl", "p")], "with 2 data.pkl entries"),
    ([("archive/readme", "p")], "without data.pkl"),
])  # fmt: skip
def test_entry_names(tmp_path, names, quoted):
    with pytest.raises(RecordFormatError, match=quoted.replace("\\", "\\\\").replace(".", r"\.")):
        read_pytorch(write_zip(tmp_path / "n.pt", b"", {}, names=names))


def test_many_entries_and_a_huge_pickle_are_refused_by_limit(tmp_path):
    names = [("archive/data.pkl", crafted_pickle(one_tensor("zip"))), ("archive/data/0", FLOATS)]
    names += [(f"archive/junk/{i}", b"") for i in range(300)]
    path = write_zip(tmp_path / "many.pt", b"", {}, names=names)
    with pytest.raises(
        RecordFormatError, match=r"declares 302 entries, more than WeightLimits.zip_entries \(100\)"
    ):
        read_pytorch(path, limits=WeightLimits(zip_entries=100))
    assert list(read_pytorch(path)) == ["w"]
    with pytest.raises(
        RecordFormatError,
        match=r"data.pkl' holds \d+ bytes, more than 64 \(WeightLimits.pickle_bytes\)",
    ):
        read_pytorch(path, limits=WeightLimits(pickle_bytes=64))


def test_other_compression_methods_and_byteorders(tmp_path):
    path = small_zip(tmp_path, compression=zipfile.ZIP_BZIP2)
    with pytest.raises(RecordFormatError, match="compression method 12; only stored and deflated"):
        read_pytorch(path)
    obj = one_tensor("zip")
    names = [
        ("archive/data.pkl", crafted_pickle(obj)),
        ("archive/byteorder", b"middle"),
        ("archive/data/0", FLOATS),
    ]
    with pytest.raises(RecordFormatError, match="byteorder is b'middle', not little or big"):
        read_pytorch(write_zip(tmp_path / "o.pt", b"", {}, names=names))
    names[1] = ("archive/byteorder", b"big")
    big = read_pytorch(write_zip(tmp_path / "o.pt", b"", {}, names=names))["w"].to_numpy()
    np.testing.assert_array_equal(big, np.frombuffer(FLOATS, ">f4"))
    legacy = write_legacy(tmp_path / "l.pt", one_tensor("legacy"), [("0", 4, FLOATS)], little=False)
    np.testing.assert_array_equal(
        read_pytorch(legacy)["w"].to_numpy(), np.frombuffer(FLOATS, ">f4")
    )


# ------------------------------------------------------------------ pickle-level attacks
def with_pickle(tmp_path, pickled: bytes) -> Path:
    return write_zip(tmp_path / "p.pt", pickled, {})


P2 = b"\x80\x02"
DEEP = 200_000
PICKLES = {  # name: (pickle, error type, what the message must say)
    "tuple nested 200k deep as a key": (
        P2 + b"}N" + b"\x85" * DEEP + b"Ns.",
        RecordFormatError,
        "tuples nest deeper than 64",
    ),
    "frozenset nested deep": (
        b"\x80\x04" + b"(" * 100 + b"\x91" * 100 + b".",
        RecordFormatError,
        "nest deeper than 64",
    ),
    "dicts nested 200k deep": (
        P2 + b"}X\x01\x00\x00\x00a" * DEEP + b"}" + b"s" * DEEP + b".",
        RecordFormatError,
        "dicts nest deeper than 64",
    ),
    "memo index 2**31": (P2 + b"}r\xfe\xff\xff\x7f.", RecordFormatError, "holds no tensors"),
    "text memo index 10**100": (
        P2 + b"}p" + b"1" * 100 + b"\n.",
        RecordFormatError,
        "holds no tensors",
    ),
    "bytes of 2**62": (
        b"\x80\x04\x8e" + struct.pack("<Q", 2**62) + b"ab.",
        RecordFormatError,
        "4611686018427387904 bytes declared, 3 left",
    ),
    "str of 2**40": (
        b"\x80\x04\x8d" + struct.pack("<Q", 2**40) + b"ab.",
        RecordFormatError,
        "1099511627776 bytes declared",
    ),
    "bytearray of 2**63": (
        b"\x80\x05\x96" + struct.pack("<Q", 2**63) + b"ab.",
        RecordFormatError,
        "bytes declared",
    ),
    "long of 2**31 bytes": (
        P2 + b"\x8b\xff\xff\xff\x7f.",
        RecordFormatError,
        "2147483647 bytes declared",
    ),
    "negative long length": (P2 + b"\x8b\xff\xff\xff\xff.", RecordFormatError, "-1 bytes declared"),
    "int of 5000 digits": (P2 + b"I" + b"9" * 5000 + b"\n.", RecordFormatError, "opcode INT fails"),
    "protocol 9": (b"\x80\x09}.", RecordFormatError, "pickle protocol 9 is newer than 5"),
    "unknown opcode": (P2 + b"\xff.", RecordFormatError, "opcode 0xff is not supported"),
    "no STOP": (P2 + b"}", RecordFormatError, "ends before its STOP opcode"),
    "empty stack": (P2 + b"s.", RecordFormatError, "opcode SETITEM fails"),
    "NEWOBJ": (
        P2 + b"ccollections\nOrderedDict\n)\x81.",
        UnsafePickleError,
        "refused opcode NEWOBJ",
    ),
    "INST": (b"(icollections\nOrderedDict\n.", UnsafePickleError, "refused opcode INST"),
    "EXT1": (P2 + b"\x82\x01.", UnsafePickleError, "refused opcode EXT1"),
    "STACK_GLOBAL os.system": (
        b"\x80\x04\x8c\x02os\x8c\x06system\x93.",
        UnsafePickleError,
        "refused to load 'os.system'",
    ),
    "REDUCE on a storage type": (
        P2 + b"ctorch\nFloatStorage\n)R.",
        RecordFormatError,
        "is not a callable this file may use",
    ),
    "REDUCE with bad arguments": (
        P2 + b"ccollections\nOrderedDict\nK\x01\x85R.",
        RecordFormatError,
        "opcode REDUCE fails: TypeError",
    ),
    "text persistent id": (
        P2 + b"Pstorage\n.",
        UnsafePickleError,
        "unknown persistent id 'storage'",
    ),
    "STRING opcode": (b"S'abc'\n.", RecordFormatError, "opcode STRING is not supported"),
    "out-of-band buffer": (
        b"\x80\x05\x97.",
        RecordFormatError,
        "opcode NEXT_BUFFER is not supported",
    ),
}


@pytest.mark.parametrize("case", PICKLES)
def test_hostile_pickles(tmp_path, case):
    pickled, error, quoted = PICKLES[case]
    path = with_pickle(tmp_path, pickled)
    with pytest.raises(error) as info:
        read_pytorch(path)
    assert str(info.value).startswith(f"{path}: ") and quoted in str(info.value)


def test_hostile_pickles_cost_no_memory(tmp_path):
    paths = [write_zip(tmp_path / f"p{i}.pt", PICKLES[case][0], {}) for i, case in enumerate(
        ["memo index 2**31", "bytes of 2**62", "str of 2**40", "bytearray of 2**63",
         "long of 2**31 bytes", "tuple nested 200k deep as a key"])]  # fmt: skip
    result = probe_peak_memory([*paths, expanded_control(tmp_path)])
    *growth, control = result["peak_growth_mib"]
    print(f"\npeak RSS growth on hostile pickles: {max(growth):.2f} MiB "
          f"(control {control:.1f} MiB)")  # fmt: skip
    outcomes = result["outcomes"]
    assert all(o.startswith("RecordFormatError") for o in outcomes[:-1]), outcomes
    assert max(growth) < 8 and control > 40


def test_build_sets_nothing_on_the_stand_ins(tmp_path):
    # BUILD would set dtype on the shared FloatStorage stand-in: later loads must not change
    poison = P2 + b"ctorch\nFloatStorage\n}X\x05\x00\x00\x00dtypeX\x03\x00\x00\x00bads" + b"b0"
    poison += b"ctorch._utils\n_rebuild_tensor_v2\n}X\x04\x00\x00\x00sizeX\x01\x00\x00\x00xsb0}."
    with pytest.raises(RecordFormatError, match="holds no tensors"):
        read_pytorch(with_pickle(tmp_path, poison))
    path = save({"w": torch.arange(3.0)}, tmp_path / "w.pt", "zip")
    np.testing.assert_array_equal(read_pytorch(path)["w"].to_numpy(), [0.0, 1.0, 2.0])


# ------------------------------------------------------------------ safetensors attacks
def st_bytes(header, data: bytes = b"", length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


EIGHT = bytes(range(8))
SAFETENSORS = {  # name: (file bytes, what the message must quote)
    "too short": (b"\x01\x00", "2 bytes, too short for the header length"),
    "header past the file": (
        st_bytes(b"{}", length=10**6),
        "header length 1000000 exceeds the 2 bytes",
    ),
    "header length 2**64-1": (st_bytes(b"{}", length=2**64 - 1), "18446744073709551615 exceeds"),
    "not JSON": (st_bytes(b"{not json}"), "the header is not JSON"),
    "a JSON list": (st_bytes(b"[1, 2]"), "is not a JSON object"),
    "bad UTF-8": (st_bytes(b'{"\xff": 1}'), "the header is not JSON"),
    "JSON nested 100k deep": (
        st_bytes(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        "not JSON",
    ),
    "a key twice": (st_bytes(b'{"w": 1, "w": 2}'), "the header names 'w' twice"),
    "entry not a map": (st_bytes({"w": 3}), "w: is 3, not {dtype, shape, data_offsets}"),
    "missing field": (st_bytes({"w": {"dtype": "F32", "shape": [2]}}, EIGHT), "not {dtype, shape"),
    "unknown dtype": (
        st_bytes({"w": entry("C64")}, EIGHT),
        "w: dtype 'C64' is not one ember reads",
    ),
    "dtype not a string": (st_bytes({"w": entry(5)}, EIGHT), "dtype 5 is not"),
    "negative shape": (st_bytes({"w": entry(shape=(-2,))}, EIGHT), "w: shape [-2] is -2, outside"),
    "float shape": (
        st_bytes({"w": entry(shape=(2.0,))}, EIGHT),
        "shape [2.0] is 2.0, not an integer",
    ),
    "bool shape": (st_bytes({"w": entry(shape=(True,))}, EIGHT), "is True, not an integer"),
    "shape not a list": (st_bytes({"w": {**entry(), "shape": 2}}, EIGHT), "shape is 2, not a list"),
    "shape of 2**64 elements": (
        st_bytes({"w": entry(shape=(2**32, 2**32))}, EIGHT),
        "shape (4294967296, 4294967296) describes more than 2**63 bytes",
    ),
    "shape of 2**40 elements": (
        st_bytes({"w": entry(shape=(2**20, 2**20))}, EIGHT),
        "span 8 bytes; shape [1048576, 1048576] of F32 needs 4398046511104",
    ),
    "offsets not a pair": (
        st_bytes({"w": entry(offsets=(0, 4, 8))}, EIGHT),
        "data_offsets is [0, 4, 8]",
    ),
    "negative offset": (
        st_bytes({"w": entry(offsets=(-8, 0))}, EIGHT),
        "data_offsets[0] is -8, outside [0, 8]",
    ),
    "offset past the data": (
        st_bytes({"w": entry(offsets=(0, 16))}, EIGHT),
        "data_offsets[1] is 16, outside [0, 8]",
    ),
    "float offset": (st_bytes({"w": entry(offsets=(0.0, 8))}, EIGHT), "data_offsets[0] is 0.0"),
    "end before begin": (st_bytes({"w": entry(offsets=(8, 0))}, EIGHT), "span -8 bytes"),
    "span not dtype times shape": (
        st_bytes({"w": entry(shape=(3,))}, EIGHT),
        "span 8 bytes; shape [3] of F32 needs 12",
    ),
    "overlap": (
        st_bytes({"a": entry(offsets=(0, 8)), "b": entry(shape=(1,), offsets=(4, 8))}, EIGHT),
        "b: data_offsets begin at 4: the tensor overlaps the tensor before it",
    ),
    "gap": (
        st_bytes({"a": entry(shape=(1,), offsets=(4, 8))}, EIGHT),
        "leaves bytes 0 to 4 unused",
    ),
    "data not covered": (
        st_bytes({"a": entry(shape=(1,), offsets=(0, 4))}, EIGHT),
        "cover 4 of the 8 data bytes",
    ),
    "metadata a list": (
        st_bytes({"__metadata__": [1]}),
        "__metadata__: is [1], not a map of strings",
    ),
    "metadata numbers": (st_bytes({"__metadata__": {"a": 1}}), "is {'a': 1}, not a map"),
    "metadata nested": (
        st_bytes({"__metadata__": {"a": {"b": "c"}}}),
        "not a map of strings to strings",
    ),
}


@pytest.mark.parametrize("case", SAFETENSORS)
def test_hostile_safetensors(tmp_path, case):
    content, quoted = SAFETENSORS[case]
    path = tmp_path / "h.safetensors"
    path.write_bytes(content)
    with pytest.raises(RecordFormatError) as info:
        read_safetensors(path)
    assert str(info.value).startswith(f"{path}: not a valid safetensors file: ") and quoted in str(
        info.value
    )
    assert info.value.file == str(path)
    with pytest.raises(safetensors.SafetensorError):  # the library refuses each of them too
        safetensors.deserialize(content)


def test_safetensors_the_library_reads_and_ember_does_not(tmp_path):
    path = tmp_path / "f4.safetensors"
    path.write_bytes(st_bytes({"w": entry("F4", (16,))}, EIGHT))  # 4-bit floats, two to a byte
    with pytest.raises(RecordFormatError, match="w: dtype 'F4' is not one ember reads"):
        read_safetensors(path)
    path.write_bytes(st_bytes({"w": {**entry(), "extra": {"x": [1]}}}, EIGHT))  # ignored by both
    assert read_safetensors(path)[0]["w"].to_numpy().tobytes() == EIGHT


def test_safetensors_header_limit_and_param_ids(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(st_bytes({"__metadata__": {"note": "x" * 1000}}))
    with pytest.raises(RecordFormatError, match=r"exceeds WeightLimits.header_bytes \(100\)"):
        read_safetensors(path, limits=WeightLimits(header_bytes=100))
    assert read_safetensors(path)[1] == {"note": "x" * 1000}
    for ids, quoted in [
        ("[" * 100_000, "is not JSON"),
        ('{"w": 5}', "is {'w': 5}, not a map of names to ids"),
    ]:
        path.write_bytes(st_bytes({"__metadata__": {"ember.param_ids": ids}, "w": entry()}, EIGHT))
        with pytest.raises(RecordFormatError, match=quoted.replace("[", r"\[").replace("{", r"\{")):
            SafetensorsFileRecorder().load(path)


def test_bool_bytes_other_than_0_and_1_read_as_true(tmp_path):
    path = tmp_path / "b.safetensors"
    path.write_bytes(st_bytes({"b": entry("BOOL", (4,), (0, 4))}, bytes([0, 1, 2, 255])))
    assert read_safetensors(path)[0]["b"].to_numpy().view(np.uint8).tolist() == [0, 1, 1, 1]


def test_names_too_deep_to_nest(tmp_path):
    with pytest.raises(RecordFormatError, match="has more than 256 dotted parts"):
        ImportedRecord({"a." * 300 + "w": TensorData([1.0])}).tree()


# ------------------------------------------------------------------ reads are copies
@pytest.mark.parametrize("kind", ["zip", "legacy", "safetensors"])
def test_tensors_do_not_change_when_the_file_is_overwritten_or_truncated(tmp_path, kind):
    state = {"w": torch.arange(1000.0).reshape(10, 100), "b": torch.ones(3)}
    path = tmp_path / "w.bin"
    if kind == "safetensors":
        st_torch.save_file(state, path)
        tensors = read_safetensors(path)[0]
    else:
        tensors = read_pytorch(save(state, path, kind))
    size = path.stat().st_size
    with open(path, "r+b") as file:
        file.write(b"\xff" * size)
    path.write_bytes(b"")
    for name, value in state.items():
        np.testing.assert_array_equal(tensors[name].to_numpy(), value.numpy())


# ------------------------------------------------------------------ the fuzz
HOSTILE_VALUES = [-1, -(2**63), 2**63, 2**64, 10**10, 10**30, 1.5, float("nan"), None, "3", True,
                  (), (1,), [2], (2**62, 2**62), 7, 0, 2**31]  # fmt: skip


def base_state() -> dict:
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=generator)
    return {
        "conv.weight": torch.randn(2, 3, 2, generator=generator), "conv.bias": torch.zeros(2),
        "t": base.t(), "row": base[1], "slice": base[:, ::2], "tied": base,
        "mask": torch.ones(1, 1).expand(3, 4), "half": torch.randn(5, generator=generator).half(),
        "bf16": torch.randn(3, generator=generator).bfloat16(),
        "ids": torch.arange(6).reshape(2, 3),
        "flags": torch.tensor([True, False, True]), "bytes": torch.arange(5, dtype=torch.uint8),
        "scalar": torch.tensor(2.5, dtype=torch.float64), "empty": torch.zeros(0, 3),
        "nested": {"i8": torch.tensor([-3, 4], dtype=torch.int8)},
    }  # fmt: skip


def saved_deterministically(state: dict, path: Path, layout: str) -> bytes:
    """torch.save's bytes with its two random parts fixed, so that a seed fixes every case:
    the zip's serialization id, and the legacy storage keys (memory addresses)."""
    data = save(state, path, layout).read_bytes()
    if layout == "legacy":
        return renumbered_legacy_keys(data, state)
    name = next(n for n in zipfile.ZipFile(path).namelist() if n.endswith(".data/serialization_id"))
    central, local = entry_offsets(data, name)
    name_length, extra_length = struct.unpack("<2H", data[local + 26 : local + 30])
    start = local + 30 + name_length + extra_length
    size = struct.unpack("<L", data[central + 24 : central + 28])[0]
    fixed = b"0" * size
    data = data[:start] + fixed + data[start + size :]
    return patch(
        patch(data, local + 14, "<L", zlib.crc32(fixed)), central + 16, "<L", zlib.crc32(fixed)
    )


def renumbered_legacy_keys(data: bytes, state: dict) -> bytes:
    """A legacy file with its storage keys (addresses, listed in address order) renamed 0, 1, ...
    in the order the object pickle names them, and the key list and storages in that order."""
    stream, bounds = io.BytesIO(data), []
    for _ in range(5):  # the five pickles
        start = stream.tell()
        for _ in pickletools.genops(stream):
            pass
        bounds.append((start, stream.tell()))
    nbytes = {
        str(t.untyped_storage()._cdata): t.untyped_storage().nbytes()
        for t in flatten(state).values()
    }
    listed = pickle.loads(data[slice(*bounds[4])])
    blocks, position = {}, bounds[4][1]
    for key in listed:
        blocks[key] = data[position : position + 8 + nbytes[key]]
        position += 8 + nbytes[key]
    obj = data[slice(*bounds[3])]
    order = sorted(listed, key=lambda k: obj.find(k.encode()))
    for i, key in enumerate(
        order
    ):  # BINUNICODE strings: nothing in a pickle counts bytes past them
        obj = obj.replace(
            b"X" + struct.pack("<I", len(key)) + key.encode(),
            b"X" + struct.pack("<I", len(str(i))) + str(i).encode(),
        )
    keys = pickle.dumps([str(i) for i in range(len(order))], protocol=2)
    return data[: bounds[2][1]] + obj + keys + b"".join(blocks[key] for key in order)


def byte_mutation(data: bytes, rng: random.Random) -> bytes:
    data = bytearray(data or b"\x00")
    kind = rng.randrange(7)
    at = rng.randrange(len(data))
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == 1:
        data[at:at] = rng.randbytes(rng.randint(1, 16))
    elif kind == 2:
        del data[at : at + rng.randint(1, 64)]
    elif kind == 3:
        del data[at:]
    elif kind == 4:
        n = rng.randint(1, 32)
        data[at : at + n] = rng.randbytes(n)
    elif kind == 5:
        fmt = rng.choice(["<q", "<Q", "<I", "<i", "<H", ">q"])
        value = rng.choice([0, 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, 10**10, 255, 64])
        packed = struct.pack(
            fmt,
            value % (1 << (8 * struct.calcsize(fmt)))
            if fmt[1].isupper()
            else max(min(value, 2 ** (8 * struct.calcsize(fmt) - 1) - 1), 0),
        )
        data[at : at + len(packed)] = packed
    else:
        n = rng.randint(1, 256)
        data[at:at] = data[at : at + n]
    return bytes(data)


def hostile_pt(layout: str, rng: random.Random) -> bytes:
    """A crafted file like torch.save's, one random slot given a hostile value."""
    legacy = layout == "legacy"
    storages = {str(k): Storage(str(k), n, legacy=legacy) for k, n in enumerate([24, 4, 1])}
    obj = {"w": Tensor(storages["0"], 0, (4, 6), (6, 1)),
           "t": Tensor(storages["0"], 0, (6, 4), (1, 6)),
           "b": Tensor(storages["1"]), "m": Tensor(storages["2"], 0, (3, 4), (0, 0))}  # fmt: skip
    value = rng.choice(HOSTILE_VALUES)
    target = obj[rng.choice(list(obj))]
    slot = rng.choice(["offset", "size", "size[i]", "stride", "stride[i]", "numel", "key"])
    if slot in ("size[i]", "stride[i]"):
        name = slot[:-3]
        dims = list(getattr(target, name))
        if dims:
            dims[rng.randrange(len(dims))] = value
        setattr(target, name, tuple(dims))
    elif slot == "numel":
        target.storage.numel = value
    elif slot == "key":
        target.storage.key = rng.choice([0, None, "../0", "9", ("0",)])
    else:
        setattr(target, slot, value)
    data = {
        k: bytes(range(4 * n)) if 4 * n < 256 else bytes(4 * n)
        for k, n in [("0", 24), ("1", 4), ("2", 1)]
    }
    path_free = io.BytesIO()
    if layout == "zip":
        buffer = io.BytesIO()
        with zipfile.ZipFile(
            buffer, "w", rng.choice([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
        ) as archive:
            archive.writestr("archive/data.pkl", crafted_pickle(obj))
            for key, raw in data.items():
                archive.writestr(f"archive/data/{key}", raw)
            archive.writestr("archive/version", "3\n")
        return buffer.getvalue()
    for part in (LEGACY_MAGIC, 1001, {"little_endian": True}):
        pickle.dump(part, path_free, protocol=2)
    path_free.write(crafted_pickle(obj))
    pickle.dump(list(data), path_free, protocol=2)
    counts = {"0": 24, "1": 4, "2": 1}
    if rng.random() < 0.3:
        counts[rng.choice(list(counts))] = rng.choice([-1, 0, 10**10, 2**63 - 1, 5])
    for key, raw in data.items():
        path_free.write(struct.pack("<q", counts[key]) + raw)
    return path_free.getvalue()


def hostile_safetensors(content: bytes, rng: random.Random) -> bytes:
    """The file with its JSON header edited: a field of a tensor, the metadata or the length."""
    (size,) = struct.unpack("<Q", content[:8])
    header, data = json.loads(content[8 : 8 + size]), content[8 + size :]
    names = [n for n in header if n != "__metadata__"]
    kind = rng.randrange(6)
    name = rng.choice(names)
    if kind == 0:
        field = rng.choice(["dtype", "shape", "data_offsets"])
        header[name][field] = rng.choice(
            [*HOSTILE_VALUES[:10], "F64", "BF16", "BOOL", "I4", [], [0, 0]]
        )
    elif kind == 1:
        dims = header[name]["shape"] or [1]
        dims[rng.randrange(len(dims))] = rng.choice([0, 1, 3, 2**31, 2**62, -1])
        header[name]["shape"] = dims
    elif kind == 2:
        other = rng.choice(names)
        header[name]["data_offsets"], header[other]["data_offsets"] = (
            header[other]["data_offsets"],
            header[name]["data_offsets"],
        )
    elif kind == 3:
        header["__metadata__"] = rng.choice([{"a": 1}, [], "x", None, {"a": "b" * 100}, {"": ""}])
    elif kind == 4:
        del header[name]
    raw = json.dumps(header).encode()
    length = (
        len(raw) if kind != 5 else rng.choice([0, len(raw) - 1, len(raw) + 1, 2**63, 2**64 - 1])
    )
    return struct.pack("<Q", length) + raw + data


def torch_bytes(value) -> bytes:
    value = value.contiguous().reshape(-1)
    if value.dtype == torch.bool:
        return value.to(torch.uint8).numpy().tobytes()
    return value.view(torch.uint8).numpy().tobytes()


def flatten(obj, prefix=""):
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    out = {}
    for key, value in obj.items() if isinstance(obj, dict) else ():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def well_formed(tensors: dict) -> None:
    for data in tensors.values():
        array = data.buffer()
        assert isinstance(data, TensorData) and array.flags.c_contiguous
        assert array.size == math.prod(array.shape) and data.dtype is not None
        if array.size:
            raw = array.reshape(-1).view(np.uint8)
            raw.sum()  # every byte is really there
            if array.dtype == np.bool_:
                assert raw.max() <= 1


def check_against_references(kind: str, path: Path, content: bytes, tensors: dict) -> bool:
    """Where ember loads a file, the tool that wrote it loads the same bytes; whether it did
    (torch may refuse a container that ember reads; the safetensors library never may)."""
    if kind == "safetensors":
        reference = {name: info for name, info in safetensors.deserialize(content)}
        assert sorted(reference) == sorted(tensors)
        for name, info in reference.items():
            raw = np.frombuffer(bytes(info["data"]), np.uint8)
            if info["dtype"] == "BOOL":
                raw = (raw != 0).view(np.uint8)
            assert tuple(info["shape"]) == tensors[name].shape
            assert tensors[name].buffer().reshape(-1).view(np.uint8).tobytes() == raw.tobytes()
        return True
    else:
        try:
            reference = flatten(torch.load(path, weights_only=True))
        except Exception:  # torch insists on entries ember does not read (version, ...)
            return False
        for name, data in tensors.items():
            if name not in reference:  # a key that is no string prints each side's own objects
                assert "(" in name or " object at 0x" in name, name
                continue
            assert tuple(reference[name].shape) == data.shape
            assert data.buffer().reshape(-1).view(np.uint8).tobytes() == torch_bytes(
                reference[name]
            )
    return True


FUZZ_CASES = {"zip": 2500, "legacy": 2500, "safetensors": 3000}


@pytest.mark.parametrize("kind", FUZZ_CASES)
def test_fuzzed_files_fail_typed_or_load_well_formed(tmp_path, kind):
    rng = random.Random(f"ember-weights-{kind}")
    base = tmp_path / "base"
    if kind == "safetensors":
        state = {k: v.contiguous().clone() for k, v in flatten(base_state()).items()}
        st_torch.save_file(state, base)
        original = base.read_bytes()
    else:
        original = saved_deterministically(base_state(), base, kind)
    assert (
        read_safetensors(base)
        if kind == "safetensors"
        else read_pytorch(base.write_bytes(original) and base)
    )
    path = tmp_path / "case"
    counts: Counter = Counter()
    raw_errors: list[str] = []
    reference_errors: list[str] = []
    start = time.perf_counter()
    for case in range(FUZZ_CASES[kind]):
        if rng.random() < 0.35:  # structural, then perhaps bytes changed too
            content = (
                hostile_safetensors(original, rng)
                if kind == "safetensors"
                else hostile_pt(kind, rng)
            )
            content = byte_mutation(content, rng) if rng.random() < 0.3 else content
        else:
            content = byte_mutation(original, rng)
        path.write_bytes(content)
        counts["cases"] += 1
        try:
            tensors = read_safetensors(path)[0] if kind == "safetensors" else read_pytorch(path)
        except EmberError:
            counts["typed errors"] += 1
            continue
        except Exception as exc:  # the bug this test hunts
            counts["raw errors"] += 1
            raw_errors.append(f"case {case}: {type(exc).__name__}: {exc}"[:300])
            continue
        counts["loaded"] += 1
        well_formed(tensors)
        try:
            counts["loaded by the reference too"] += check_against_references(
                kind, path, content, tensors
            )
        except Exception as exc:
            reference_errors.append(f"case {case}: {type(exc).__name__}: {exc}"[:300])
    seconds = time.perf_counter() - start
    print(f"\nfuzz {kind}: {dict(counts)} in {seconds:.1f} s")
    assert raw_errors == [], "\n".join(raw_errors)
    assert reference_errors == [], "\n".join(reference_errors)
    # both outcomes are exercised, and most loads are checked against the writer's own reader
    assert (
        counts["typed errors"] > counts["cases"] // 4 and counts["loaded"] > counts["cases"] // 50
    )
    assert counts["loaded by the reference too"] > counts["loaded"] * 2 // 3
