"""Weight files written by real torch.save and safetensors, loaded without torch's help."""

from __future__ import annotations

import builtins
import importlib
import io
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

import ember
from ember import Tensor
from ember.backend.errors import (
    RecordFileNotFoundError,
    RecordFormatError,
    RecordMismatchError,
    UnsafePickleError,
)
from ember.module import Module, Param
from ember.record import LoadArgs, PyTorchFileRecorder, SafetensorsFileRecorder
from ember.record.pytorch import read_pytorch
from ember.record.safetensors import read_safetensors, write_safetensors
from ember.tensor.module import conv2d

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")

NDARRAY = ember.device("ndarray")
FORMATS = {"zip": True, "legacy": False}
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool]  # fmt: skip


def as_numpy(t):
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def assert_same(data, reference) -> None:
    assert data.shape == tuple(reference.shape)
    np.testing.assert_array_equal(data.to_numpy().astype(np.float64), as_numpy(reference).astype(np.float64))


def save(obj, path: Path, layout: str) -> Path:
    torch.save(obj, path, _use_new_zipfile_serialization=FORMATS[layout])
    return path


# ------------------------------------------------------------------ reading torch.save files
@pytest.mark.parametrize("layout", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype(tmp_path, layout, dtype):
    values = (torch.arange(-6, 6).reshape(3, 4) % 5).to(dtype)
    tensors = read_pytorch(save({"x": values}, tmp_path / "w.pt", layout))
    assert tensors["x"].dtype.value == {torch.bool: "bool", torch.uint8: "u8"}.get(
        dtype, str(dtype).replace("torch.float", "f").replace("torch.int", "i").replace("torch.bfloat16", "bf16")
    )
    assert_same(tensors["x"], values)


@pytest.mark.parametrize("layout", FORMATS)
def test_state_dicts_of_real_modules(tmp_path, layout):
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
        torch.nn.Linear(4, 3), torch.nn.Embedding(5, 2),
    )
    net[1].train()
    net[1](torch.randn(3, 4, 5, 5))  # non-trivial running statistics
    state = net.state_dict()
    tensors = read_pytorch(save(state, tmp_path / "net.pth", layout))
    assert list(tensors) == list(state)
    for name, value in state.items():
        assert_same(tensors[name], value)
    assert tensors["1.num_batches_tracked"].dtype.value == "i64"


@pytest.mark.parametrize("layout", FORMATS)
def test_views_shared_storage_scalars_and_empty(tmp_path, layout):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {
        "transposed": base.t(), "sliced": base[1:3, ::2], "tied": base, "row": base[2],
        "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 3),
    }  # fmt: skip
    tensors = read_pytorch(save(state, tmp_path / "v.pt", layout))
    for name, value in state.items():
        assert_same(tensors[name], value)


@pytest.mark.parametrize("layout", FORMATS)
def test_dtypes_of_rebuild_tensor_v3_and_a_tensor_named_twice(tmp_path, layout):
    # torch writes uint16/32/64 and float8 as untyped storages with a dtype beside them
    state = {
        "u16": torch.tensor([1, 60000, 7], dtype=torch.int32).to(torch.uint16),
        "u32": torch.tensor([4_000_000_000], dtype=torch.int64).to(torch.uint32),
        "f8": torch.tensor([0.5, -2.0, 448.0]).to(torch.float8_e4m3fn),
        "a": torch.arange(4.0),
    }
    state["b"] = state["a"]
    tensors = read_pytorch(save(state, tmp_path / "v3.pt", layout))
    assert [tensors[n].dtype.value for n in state] == ["u16", "u32", "f8e4m3fn", "f32", "f32"]
    assert tensors["u16"].to_numpy().tolist() == [1, 60000, 7]
    assert tensors["u32"].to_numpy().tolist() == [4_000_000_000]
    assert tensors["f8"].to_numpy().astype(np.float32).tolist() == [0.5, -2.0, 448.0]
    assert tensors["b"].to_numpy().tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("layout", FORMATS)
def test_nested_checkpoints(tmp_path, layout):
    checkpoint = {"model": {"w": torch.ones(2), "sub": {"b": torch.zeros(1)}}, "epoch": 3, "name": "run"}
    path = save(checkpoint, tmp_path / "ckpt.pt", layout)
    assert list(read_pytorch(path)) == ["model.w", "model.sub.b"]
    assert list(read_pytorch(path, top_level_key="model")) == ["w", "sub.b"]
    with pytest.raises(RecordFormatError, match="no top-level key 'state'"):
        read_pytorch(path, top_level_key="state")


# ------------------------------------------------------------------ security
class Exploit:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def attacks(marker: Path):
    command = f"touch {marker}"
    code = f"open({str(marker)!r}, 'w').close()"
    return {
        "os.system": (Exploit(os.system, command), "system"),
        "eval": (Exploit(eval, code), "eval"),
        "exec": (Exploit(builtins.exec, code), "exec"),
        "import": (Exploit(importlib.import_module, "this"), "import_module"),
        "getattr": (Exploit(getattr, "text", "upper"), "getattr"),
    }


@pytest.mark.parametrize("attack", ["os.system", "eval", "exec", "import", "getattr"])
@pytest.mark.parametrize("layout", FORMATS)
def test_malicious_pickles_are_refused_and_nothing_runs(tmp_path, attack, layout):
    marker = tmp_path / "pwned"
    payload, name = attacks(marker)[attack]
    path = tmp_path / "evil.pt"
    if layout == "zip":
        save({"w": torch.ones(2)}, path, "zip")
        with zipfile.ZipFile(path) as archive:
            members = {n: archive.read(n) for n in archive.namelist()}
        pickled = next(n for n in members if n.endswith("data.pkl"))
        members[pickled] = pickle.dumps({"w": payload}, protocol=2)
        with zipfile.ZipFile(path, "w") as archive:
            for member, content in members.items():
                archive.writestr(member, content)
    else:
        buffer = io.BytesIO()
        for part in (0x1950A86A20F9469CFC6C, 1001, {"little_endian": True}, {"w": payload}, []):
            pickle.dump(part, buffer, protocol=2)
        path.write_bytes(buffer.getvalue())
    with pytest.raises(UnsafePickleError, match=f"refused to load .*{name}") as info:
        read_pytorch(path)
    assert info.value.file == str(path)
    assert not marker.exists()


def test_malicious_first_pickle_of_a_legacy_file(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps(Exploit(os.system, f"touch {marker}"), protocol=2))
    with pytest.raises(UnsafePickleError, match="refused to load"):
        read_pytorch(path)
    assert not marker.exists()


# ------------------------------------------------------------------ bad files
def test_missing_file(tmp_path):
    with pytest.raises(RecordFileNotFoundError, match=r"nope\.pt does not exist"):
        read_pytorch(tmp_path / "nope.pt")


@pytest.mark.parametrize("layout", FORMATS)
def test_truncated_files(tmp_path, layout):
    path = save({"w": torch.ones(1000)}, tmp_path / "w.pt", layout)
    path.write_bytes(path.read_bytes()[:-500])
    with pytest.raises(RecordFormatError, match=str(path)):
        read_pytorch(path)


def test_garbage_and_foreign_zip(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x00not a pickle at all" * 10)
    with pytest.raises(RecordFormatError, match="neither a zip nor a legacy PyTorch file"):
        read_pytorch(garbage)
    foreign = tmp_path / "foreign.pt"
    with zipfile.ZipFile(foreign, "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(RecordFormatError, match=r"without data\.pkl"):
        read_pytorch(foreign)


def test_a_file_without_tensors(tmp_path):
    with pytest.raises(RecordFormatError, match="holds no tensors"):
        read_pytorch(save({"epoch": 3}, tmp_path / "e.pt", "zip"))


# ------------------------------------------------------------------ the book's examples
class Conv(Module):
    weight: Param
    bias: Param | None = None

    def forward(self, x: Tensor) -> Tensor:
        return conv2d(x, self.weight.val(), None if self.bias is None else self.bias.val())


class Net(Module):
    conv1: Conv
    conv2: Conv

    def forward(self, x: Tensor) -> Tensor:
        return self.conv2(self.conv1(x))


def fresh_net(device=NDARRAY) -> Net:
    def param(*shape):
        return Param(Tensor.zeros(list(shape), device))

    return Net(Conv(param(2, 2, 2, 2), param(2)), Conv(param(2, 2, 2, 2)))


class TorchConvModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(2, 2, (2, 2))
        self.conv2 = torch.nn.Conv2d(2, 2, (2, 2), bias=False)

    def forward(self, x):
        return self.conv2(self.conv1(x))


@pytest.mark.parametrize("layout", FORMATS)
def test_book_conv2d_import_gives_torch_outputs(tmp_path, layout):
    torch.manual_seed(42)
    reference = TorchConvModule()
    path = save(reference.state_dict(), tmp_path / "conv2d.pt", layout)
    model = fresh_net().load_record(PyTorchFileRecorder().load(path))
    x = torch.randn(1, 2, 4, 4)
    out = model(Tensor.from_data(x.numpy(), NDARRAY))
    np.testing.assert_allclose(out.to_numpy(), reference(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_book_key_remap_and_partial_model(tmp_path):
    torch.manual_seed(1)
    wrapper = torch.nn.Module()
    wrapper.conv = TorchConvModule()
    wrapper.decoder = torch.nn.Linear(3, 3)
    path = save(wrapper.state_dict(), tmp_path / "key_remap.pt", "zip")
    record = PyTorchFileRecorder().load(LoadArgs(path).with_key_remap(r"conv\.(.*)", "$1"))
    with pytest.raises(RecordMismatchError, match=r"decoder\.weight: in the record but not in the module"):
        fresh_net().load_record(record)
    model, report = fresh_net().load_record_partial(record)
    assert report.unexpected == ["decoder.weight", "decoder.bias"]
    assert report.missing == []
    np.testing.assert_array_equal(model.conv1.weight.val().to_numpy(), wrapper.conv.conv1.weight.detach().numpy())


def test_imported_weights_load_at_the_module_precision_and_device(tmp_path):
    reference = TorchConvModule().double()
    path = save(reference.state_dict(), tmp_path / "f64.pt", "zip")
    torch_device = ember.device("torch").autodiff()
    model = fresh_net(torch_device).load_record(PyTorchFileRecorder().load(path))
    assert model.conv1.weight.dtype.value == "f32" and model.devices() == [torch_device]
    assert model.conv1.weight.val().is_require_grad()


# ------------------------------------------------------------------ safetensors
ST_DTYPES = ["f64", "f32", "f16", "bf16", "i64", "i32", "i16", "i8", "u8", "bool"]


def test_safetensors_round_trip_every_dtype(tmp_path):
    from ember import TensorData

    tensors = {d: TensorData(np.arange(-3, 3).reshape(2, 3) % 2 == 0 if d == "bool" else np.arange(6).reshape(2, 3), d)
               for d in ST_DTYPES}
    tensors["scalar"] = TensorData(np.float32(2.5))
    write_safetensors(tmp_path / "t.safetensors", tensors, {"note": "hi"})
    loaded, metadata = read_safetensors(tmp_path / "t.safetensors")
    # the library orders tensors by alignment in the file
    assert metadata == {"note": "hi"} and sorted(loaded) == sorted(tensors)
    for name, data in tensors.items():
        assert loaded[name] == data


def test_safetensors_interop_with_the_library(tmp_path):
    reference = {"w": torch.randn(3, 4), "h": torch.randn(2).to(torch.bfloat16), "i": torch.arange(5)}
    st_torch.save_file(reference, tmp_path / "torch.safetensors", metadata={"format": "pt"})
    loaded, metadata = read_safetensors(tmp_path / "torch.safetensors")
    assert metadata == {"format": "pt"}
    for name, value in reference.items():
        assert_same(loaded[name], value)
    write_safetensors(tmp_path / "ember.safetensors", loaded)
    back = st_torch.load_file(tmp_path / "ember.safetensors")
    for name, value in reference.items():
        assert back[name].dtype == value.dtype and torch.equal(back[name], value)


def test_safetensors_recorder_keeps_ids_and_loads_torch_files(tmp_path):
    model = fresh_net().map(lambda _, p: p.val() + 1)
    path = SafetensorsFileRecorder().save(model, tmp_path / "model")
    assert path.name == "model.safetensors"
    loaded = fresh_net().load_record(SafetensorsFileRecorder().load(tmp_path / "model"))
    assert [p.id for _, p in loaded.params()] == [p.id for _, p in model.params()]
    reference = TorchConvModule()
    st_torch.save_file(reference.state_dict(), tmp_path / "ref.safetensors")
    imported = fresh_net().load_record(SafetensorsFileRecorder().load(tmp_path / "ref.safetensors"))
    np.testing.assert_array_equal(imported.conv2.weight.val().to_numpy(), reference.conv2.weight.detach().numpy())


def test_safetensors_errors(tmp_path):
    with pytest.raises(RecordFileNotFoundError, match="does not exist"):
        read_safetensors(tmp_path / "none.safetensors")
    path = tmp_path / "t.safetensors"
    st_torch.save_file({"w": torch.ones(100)}, path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(RecordFormatError, match="not a valid safetensors file"):
        read_safetensors(path)
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    with pytest.raises(RecordFormatError, match="not a valid safetensors file"):
        read_safetensors(path)
    with pytest.raises(RecordFileNotFoundError, match="does not exist"):
        write_safetensors(tmp_path / "missing" / "t.safetensors", {})


def test_safetensors_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    from ember import TensorData

    path = tmp_path / "t.safetensors"
    write_safetensors(path, {"w": TensorData([1.0])})
    good = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        write_safetensors(path, {"w": TensorData([2.0, 3.0])})
    assert path.read_bytes() == good and os.listdir(tmp_path) == ["t.safetensors"]
