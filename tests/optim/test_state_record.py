"""Optimizer state as a record: saved mid-run with a recorder, restored into a fresh optimizer,
the run continues exactly; malformed records are refused with errors naming the key."""

from __future__ import annotations

import numpy as np
import pytest
from optim_helpers import (
    Mlp,
    assert_trajectories_close,
    ember_mlp,
    torch_mlp,
    train_ember,
)

import ember
from ember import Tensor, TensorData
from ember.backend.errors import RecordMismatchError
from ember.module import Param
from ember.nn.linear import LinearConfig
from ember.optim.adagrad import AdaGradConfig
from ember.optim.adam import AdamConfig
from ember.optim.adamw import AdamWConfig
from ember.optim.clipping import GradientClippingConfig
from ember.optim.momentum import MomentumConfig
from ember.optim.rmsprop import RmsPropConfig
from ember.optim.sgd import SgdConfig
from ember.record import (
    BinBytesRecorder,
    HalfPrecision,
    NamedMpkFileRecorder,
    PrettyJsonFileRecorder,
)

HALF = 6  # steps before the save, and after it


def _round_trip_bytes(record):
    recorder = BinBytesRecorder()
    return recorder.from_bytes(recorder.to_bytes(record))


def _round_trip_file(recorder, tmp_path):
    def round_trip(record):
        return recorder.load(recorder.save(record, tmp_path / "state"))

    return round_trip


def _fresh_model(device) -> Mlp:
    """A model with new random weights and new parameter ids."""
    return Mlp(LinearConfig(4, 5).init(device), LinearConfig(5, 3).init(device))


CONFIGS = {
    "adam-amsgrad-clip": AdamConfig(
        amsgrad=True, gradient_clipping=GradientClippingConfig.Norm(1.0)
    ),
    "adamw": AdamWConfig(weight_decay=0.1),
    "sgd-momentum": SgdConfig(momentum=MomentumConfig(nesterov=True)),
    "rmsprop-centered-momentum": RmsPropConfig(centered=True, momentum=0.9),
    "adagrad": AdaGradConfig(lr_decay=0.05),
}
RECORDERS = {
    "bytes": lambda tmp_path: _round_trip_bytes,
    "mpk-file": lambda tmp_path: _round_trip_file(NamedMpkFileRecorder(), tmp_path),
    "json-file": lambda tmp_path: _round_trip_file(PrettyJsonFileRecorder(), tmp_path),
}


@pytest.mark.parametrize(
    ("config", "recorder"),
    [("adam-amsgrad-clip", "bytes"), ("adamw", "mpk-file"), ("sgd-momentum", "json-file"),
     ("rmsprop-centered-momentum", "bytes"), ("adagrad", "mpk-file")],
)  # fmt: skip
def test_resumed_run_equals_the_uninterrupted_run(ad_device, tmp_path, config, recorder):
    config = CONFIGS[config]
    round_trip = RECORDERS[recorder](tmp_path)
    start = ember_mlp(torch_mlp(), ad_device)
    _, uninterrupted = train_ember(config.init(), start, 0.01, 2 * HALF, ad_device)

    optimizer = config.init()
    middle, first_half = train_ember(optimizer, start, 0.01, HALF, ad_device)
    # Model and optimizer both go through the recorder; the model's ids come back from its
    # record, which is how the restored optimizer state finds its parameters.
    saved = round_trip({"model": middle.into_record(), "optim": optimizer.to_record()})
    model = _fresh_model(ad_device).load_record(saved["model"])
    restored = config.init().load_record(saved["optim"])
    _, second_half = train_ember(restored, model, 0.01, HALF, ad_device)

    resumed = first_half + second_half
    for step, (ours, theirs) in enumerate(zip(resumed, uninterrupted)):
        for a, b in zip(ours, theirs):
            np.testing.assert_array_equal(a, b, err_msg=f"after step {step + 1}")
    assert restored.to_record().keys() == optimizer.to_record().keys()


def test_state_loads_on_another_device_and_precision(tmp_path):
    """State saved from an NdArray run at half precision continues a Torch run."""
    ndarray, torch_device = ember.device("ndarray").autodiff(), ember.device("torch").autodiff()
    config = AdamConfig()
    start = ember_mlp(torch_mlp(), ndarray)
    _, uninterrupted = train_ember(config.init(), start, 0.01, 2 * HALF, ndarray)

    optimizer = config.init()
    middle, first_half = train_ember(optimizer, start, 0.01, HALF, ndarray)
    recorder = NamedMpkFileRecorder(HalfPrecision)
    record = recorder.load(recorder.save(optimizer.to_record(), tmp_path / "state"))
    some = next(iter(record.values()))
    assert some["moment_1"].dtype.value == "f16"

    restored = config.init().load_record(record)
    # (through valid(): Tensor.to_device between two autodiff backends fails, reported)
    moved = middle.valid().fork(torch_device)
    _, second_half = train_ember(restored, moved, 0.01, HALF, torch_device)
    # f16 moments cost precision: close to the uninterrupted run, not equal to it.
    assert_trajectories_close(first_half + second_half, uninterrupted, atol=2e-3, rtol=2e-3)
    state = next(iter(restored.to_record().values()))
    assert state["moment_1"].dtype.value == "f32" and state["time"] == 2 * HALF


def test_record_layout_is_plain_data_keyed_by_param_id():
    device = ember.device("ndarray").autodiff()
    model = ember_mlp(torch_mlp(), device)
    optimizer = AdamConfig(amsgrad=True).init()
    assert optimizer.to_record() == {}
    model, _ = train_ember(optimizer, model, 0.01, 3, device)
    record = optimizer.to_record()
    assert set(record) == {str(p.id) for _, p in model.params()}
    for path, param in model.params():
        entry = record[str(param.id)]
        assert set(entry) == {"time", "moment_1", "moment_2", "max_moment_2"}
        assert entry["time"] == 3
        assert isinstance(entry["moment_1"], TensorData)
        assert entry["moment_1"].shape == param.shape, path
    # SGD without momentum keeps no state at all.
    sgd = SgdConfig().init()
    train_ember(sgd, model, 0.01, 1, device)
    assert sgd.to_record() == {}


# ---------------------------------------------------------------------- malformed records
def _adam_record():
    device = ember.device("ndarray").autodiff()
    model = ember_mlp(torch_mlp(), device)
    optimizer = AdamConfig().init()
    model, _ = train_ember(optimizer, model, 0.01, 1, device)
    return model, optimizer.to_record()


def _first(record):
    key = sorted(record)[0]
    return key, dict(record[key])


def test_load_record_refuses_what_is_not_a_dict():
    with pytest.raises(
        RecordMismatchError,
        match=r"Adam.load_record: expected a dict keyed by "
        r"parameter id .* got a list",
    ):
        AdamConfig().init().load_record([1, 2])


def test_load_record_names_a_key_that_is_not_a_param_id():
    _, record = _adam_record()
    record["not-an-id"] = {}
    with pytest.raises(
        RecordMismatchError, match="not-an-id: not a parameter id \\(16 hex digits\\): 'not-an-id'"
    ) as info:
        AdamConfig().init().load_record(record)
    assert info.value.path == "not-an-id"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda e: e.pop("moment_2"), r"{key}\.moment_2: missing from the record"),
        (lambda e: e.update(velocity=e["moment_1"]),
         r"{key}\.velocity: not part of the Adam state \(which holds time, moment_1, moment_2\)"),
        (lambda e: e.update(moment_1=3), r"{key}\.moment_1: expected a Float tensor, got a int"),
        (lambda e: e.update(moment_1=TensorData([1, 2])),
         r"{key}\.moment_1: expected a Float tensor, got a i64 tensor of shape \[2\]"),
        (lambda e: e.update(time=2.0), r"{key}\.time: expected a count \(an int >= 0\), got 2\.0"),
        (lambda e: e.update(time=-1), r"{key}\.time: expected a count .* got -1"),
        (lambda e: e.update(moment_2=TensorData(np.zeros([7], np.float32))),
         r"{key}\.moment_2: shape \[7\], while the entry's other tensors have shape"),
    ],
    ids=["missing", "unexpected", "int-for-tensor", "int-tensor", "float-count",
         "negative-count", "inconsistent-shapes"],
)  # fmt: skip
def test_load_record_names_the_malformed_field(change, message):
    _, record = _adam_record()
    key, entry = _first(record)
    change(entry)
    record[key] = entry
    optimizer = AdamConfig().init()
    with pytest.raises(RecordMismatchError, match=message.format(key=key)) as info:
        optimizer.load_record(record)
    assert info.value.path.startswith(key)
    assert optimizer.to_record() == {}  # a refused record changes nothing


def test_load_record_of_another_optimizer_is_refused():
    _, record = _adam_record()
    key, _ = _first(record)
    with pytest.raises(RecordMismatchError, match=rf"{key}\.moment_1: not part of the Sgd state"):
        SgdConfig(momentum=MomentumConfig()).init().load_record(record)
    with pytest.raises(RecordMismatchError, match=rf"{key}\.max_moment_2: missing"):
        AdamConfig(amsgrad=True).init().load_record(record)


def test_an_entry_that_is_not_a_dict_is_named():
    _, record = _adam_record()
    key, _ = _first(record)
    record[key] = [1]
    with pytest.raises(
        RecordMismatchError,
        match=rf"{key}: expected a dict of time, moment_1, "
        r"moment_2, got a list",
    ):
        AdamConfig().init().load_record(record)


def test_state_of_the_wrong_shape_for_its_parameter_is_refused_at_the_step():
    device = ember.device("ndarray").autodiff()
    weight = Param(Tensor.ones([2, 2], device))
    record = {str(weight.id): {"time": 1, "moment_1": TensorData(np.zeros([3], np.float32)),
                               "moment_2": TensorData(np.zeros([3], np.float32))}}  # fmt: skip
    model = LinearConfig(2, 2).init(device)
    model = model.map(lambda path, p: weight if path == "weight" else p)
    optimizer = AdamConfig().init().load_record(record)
    grads = model(Tensor.ones([1, 2], device)).sum().backward()
    with pytest.raises(
        RecordMismatchError,
        match=r"Adam.step: the state of parameter weight "
        r"\(id [0-9a-f]{16}\) holds moment_1 of shape "
        r"\[3\], the parameter has shape \[2, 2\]",
    ):
        optimizer.step(0.1, model, grads)
    assert optimizer.to_record().keys() == record.keys()  # the failed step kept the state
