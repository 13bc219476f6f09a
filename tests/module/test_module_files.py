"""A model through every recorder and precision, saved on one backend and loaded on another."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Tensor
from ember.backend.errors import RecordFormatError, RecordMismatchError
from ember.module import Module, Param, RunningState
from ember.record import (
    BF16Precision,
    BinBytesRecorder,
    BinFileRecorder,
    BinGzFileRecorder,
    DoublePrecision,
    FullPrecision,
    HalfPrecision,
    JsonGzFileRecorder,
    NamedMpkFileRecorder,
    NamedMpkGzFileRecorder,
    PrettyJsonFileRecorder,
)

FILE_RECORDERS = [NamedMpkFileRecorder, NamedMpkGzFileRecorder, BinFileRecorder, BinGzFileRecorder,
                  JsonGzFileRecorder, PrettyJsonFileRecorder]  # fmt: skip
PRECISIONS = {"double": DoublePrecision, "full": FullPrecision, "half": HalfPrecision, "bf16": BF16Precision}
# what each precision keeps of an f32 value: the float dtype it is stored as
STORED = {"double": np.float64, "full": np.float32, "half": np.float16, "bf16": None}
BACKENDS = ["ndarray", "torch"]


class Block(Module):
    weight: Param
    counts: Param
    stats: RunningState


class Model(Module):
    blocks: list
    head: Param
    name: str = "model"


def model(device, seed: int = 0) -> Model:
    rng = np.random.default_rng(seed)

    def block() -> Block:
        return Block(
            Param(Tensor.from_data(rng.standard_normal((3, 4)).astype(np.float32), device)),
            Param(Tensor.from_data(rng.integers(-100, 100, (5,)), device), require_grad=False),
            RunningState(Tensor.from_data(rng.random(4).astype(np.float32), device)),
        )

    return Model([block(), block()], Param(Tensor.from_data(rng.standard_normal(7).astype(np.float32), device)))


def expected(value: np.ndarray, precision: str) -> np.ndarray:
    if value.dtype.kind != "f":
        return value
    if precision == "bf16":
        import ml_dtypes

        return value.astype(ml_dtypes.bfloat16).astype(value.dtype)
    return value.astype(STORED[precision]).astype(value.dtype)


@pytest.mark.parametrize("load_on", BACKENDS)
@pytest.mark.parametrize("save_on", BACKENDS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("recorder", FILE_RECORDERS, ids=lambda r: r.__name__)
def test_round_trip(tmp_path, recorder, precision, save_on, load_on):
    source = model(ember.device(save_on))
    path = source.save_file(tmp_path / "model", recorder(PRECISIONS[precision]))
    assert path.name == f"model.{recorder.extension}"
    target = model(ember.device(load_on).autodiff(), seed=1)
    loaded = target.load_file(tmp_path / "model", recorder(PRECISIONS[precision]))
    assert loaded.devices() == [ember.device(load_on).autodiff()]
    for (path_s, p_s), (path_l, p_l) in zip(source.params(), loaded.params()):
        assert path_s == path_l and p_s.id == p_l.id and p_l.dtype == p_s.dtype
        assert type(p_l) is type(p_s) and p_l.require_grad == p_s.require_grad
        np.testing.assert_array_equal(p_l.val().to_numpy(), expected(p_s.val().to_numpy(), precision))
    assert loaded.blocks[0].weight.val().is_require_grad()
    assert not loaded.blocks[0].counts.val().is_require_grad()


@pytest.mark.parametrize("precision", PRECISIONS)
def test_bytes_recorder(precision):
    source = model(ember.device("ndarray"))
    data = BinBytesRecorder(PRECISIONS[precision]).to_bytes(source.into_record())
    loaded = model(ember.device("torch"), seed=3).load_record(BinBytesRecorder().from_bytes(data))
    np.testing.assert_array_equal(
        loaded.head.val().to_numpy(), expected(source.head.val().to_numpy(), precision)
    )


def test_double_precision_model_keeps_every_bit(tmp_path):
    device = ember.device("ndarray", float_dtype="f64")
    values = np.random.default_rng(0).standard_normal(7)
    source = Model([], Param(Tensor.from_data(values, device)))
    path = source.save_file(tmp_path / "f64", NamedMpkFileRecorder(DoublePrecision))
    loaded = Model([], Param(Tensor.zeros([7], device, dtype="f64"))).load_file(path, NamedMpkFileRecorder())
    np.testing.assert_array_equal(loaded.head.val().to_numpy(), values)


def test_wrong_recorder_and_corrupt_file(tmp_path):
    source = model(ember.device("ndarray"))
    path = source.save_file(tmp_path / "model", NamedMpkGzFileRecorder())
    with pytest.raises(RecordFormatError, match="NamedMpkGz"):
        source.load_file(path, BinGzFileRecorder())
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(RecordFormatError):
        source.load_file(path, NamedMpkGzFileRecorder())


def test_a_file_of_another_model_names_the_paths(tmp_path):
    path = model(ember.device("ndarray")).save_file(tmp_path / "model")
    other = Model([Block(*(Param(Tensor.zeros([2], ember.device("ndarray"))) for _ in range(2)),
                         RunningState(Tensor.zeros([4], ember.device("ndarray"))))],
                  Param(Tensor.zeros([7], ember.device("ndarray"))))  # fmt: skip
    with pytest.raises(RecordMismatchError) as info:
        other.load_file(path)
    message = str(info.value)
    assert "blocks.0.weight: shape [3, 4] in the record, [2] in the module" in message
    assert "blocks.1.weight: in the record but not in the module" in message
