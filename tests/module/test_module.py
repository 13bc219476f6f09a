"""Module: field roles, traversal, devices, gradients, records and their checks."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Tensor, TensorData
from ember.backend.errors import ArgumentError, RecordMismatchError
from ember.module import Module, Param, ParamId, RunningState
from ember.record.imported import ImportedRecord, flatten

NDARRAY = ember.device("ndarray")


class Affine(Module):
    scale: Param
    shift: Param
    label: str = "affine"

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale.val() + self.shift.val()


class Net(Module):
    first: Affine
    blocks: list
    heads: dict
    pair: tuple
    offset: Tensor
    stats: RunningState
    extra: Affine | None = None

    def forward(self, x: Tensor) -> Tensor:
        x = self.first(x)
        for block in [*self.blocks, *self.pair, *self.heads.values()]:
            x = block(x)
        return x + self.offset


def affine(device, scale: float = 2.0, n: int = 3) -> Affine:
    return Affine(
        Param(Tensor.full([n], scale, device)),
        Param(Tensor.arange(0, n, device=device).float()),
    )


def net(device) -> Net:
    return Net(
        first=affine(device, 1.5),
        blocks=[affine(device, 0.5), affine(device, 3.0)],
        heads={"left": affine(device, -1.0)},
        pair=(affine(device, 1.0), affine(device, 2.0)),
        offset=Tensor.ones([3], device),
        stats=RunningState(Tensor.zeros([3], device)),
    )


PATHS = [
    "first.scale", "first.shift", "blocks.0.scale", "blocks.0.shift", "blocks.1.scale",
    "blocks.1.shift", "heads.left.scale", "heads.left.shift", "pair.0.scale", "pair.0.shift",
    "pair.1.scale", "pair.1.shift", "stats",
]  # fmt: skip


def values(module: Module) -> dict[str, np.ndarray]:
    return {path: p.val().to_numpy() for path, p in module.params()}


# ------------------------------------------------------------------ fields and traversal
def test_fields_are_found_by_what_they_hold():
    model = net(NDARRAY)
    assert [path for path, _ in model.params()] == PATHS
    assert model.num_params() == 13 * 3
    assert model.first.label == "affine"
    assert model.extra is None


def test_generated_init_takes_fields_in_order_and_defaults():
    m = Affine(Param(Tensor.ones([2], NDARRAY)), Param(Tensor.zeros([2], NDARRAY)))
    assert m.label == "affine"
    with pytest.raises(TypeError, match="shift"):
        Affine(Param(Tensor.ones([2], NDARRAY)))  # type: ignore[call-arg]


def test_visit_sees_every_param_in_order():
    seen: list[tuple[str, tuple[int, ...]]] = []
    net(NDARRAY).visit(lambda path, p: seen.append((path, p.shape)))
    assert seen == [(path, (3,)) for path in PATHS]


def test_map_returns_a_new_module_and_keeps_ids():
    model = net(NDARRAY)
    doubled = model.map(lambda _, p: p.val() * 2)
    before, after = values(model), values(doubled)
    for path in PATHS:
        np.testing.assert_array_equal(after[path], before[path] * 2)
    assert [p.id for _, p in doubled.params()] == [p.id for _, p in model.params()]
    assert isinstance(doubled.stats, RunningState)
    assert doubled.offset is model.offset  # constants are not parameters
    assert doubled.first.label == "affine"


def test_map_may_return_a_param():
    model = affine(NDARRAY)
    frozen = model.map(lambda _, p: p.set_require_grad(False))
    assert [p.require_grad for _, p in frozen.params()] == [False, False]


def test_private_fields_take_no_part():
    class WithCache(Module):
        weight: Param

        def __post_init__(self) -> None:
            self._cache = Param(Tensor.ones([5], NDARRAY))

    m = WithCache(Param(Tensor.ones([2], NDARRAY)))
    assert [path for path, _ in m.params()] == ["weight"]
    assert "_cache" not in m.into_record()


def test_forward_and_call():
    x = Tensor.from_data([1.0, 2.0, 3.0], NDARRAY)
    out = net(NDARRAY)(x)
    expected = np.array([1.0, 2.0, 3.0])
    for scale, shift in [(1.5, 0), (0.5, 0), (3.0, 0), (1.0, 0), (2.0, 0), (-1.0, 0)]:
        expected = expected * scale + np.arange(3) + shift
    np.testing.assert_allclose(out.to_numpy(), expected + 1)


def test_module_without_forward_says_so():
    class Empty(Module):
        pass

    with pytest.raises(NotImplementedError, match="Empty does not define forward"):
        Empty()(1)


# ------------------------------------------------------------------ devices and gradients
def test_params_on_autodiff_are_leaves_and_get_gradients():
    device = NDARRAY.autodiff()
    model = net(device)
    loss = model(Tensor.from_data([1.0, -2.0, 0.5], device)).sum()
    grads = loss.backward()
    # d loss / d first.scale = x * (product of later scales)
    later = 0.5 * 3.0 * 1.0 * 2.0 * -1.0
    np.testing.assert_allclose(model.first.scale.val().grad(grads).to_numpy(), [later, -2 * later, 0.5 * later])
    assert model.stats.val().grad(grads) is None
    assert not model.stats.val().is_require_grad()


def test_no_grad_freezes_every_param():
    model = net(NDARRAY.autodiff()).no_grad()
    assert all(not p.require_grad and not p.val().is_require_grad() for _, p in model.params())


def test_valid_moves_to_the_inner_backend():
    device = NDARRAY.autodiff()
    model = net(device)
    valid = model.valid()
    assert valid.devices() == [NDARRAY]
    assert valid.offset.device == NDARRAY
    np.testing.assert_array_equal(valid.first.scale.val().to_numpy(), model.first.scale.val().to_numpy())
    assert valid.first.scale.id == model.first.scale.id


def test_fork_makes_fresh_leaves_on_the_device():
    device = NDARRAY.autodiff()
    model = net(NDARRAY).fork(device)
    assert model.devices() == [device]
    assert model.first.scale.val().is_require_grad()
    grads = model(Tensor.ones([3], device)).sum().backward()
    assert model.blocks[1].shift.val().grad(grads) is not None


def test_to_device_across_backends():
    torch_device = ember.device("torch")
    model = net(NDARRAY).to_device(torch_device)
    assert model.devices() == [torch_device]
    np.testing.assert_array_equal(values(model)["blocks.1.scale"], [3.0, 3.0, 3.0])


def test_fork_between_autodiff_devices_of_different_backends():
    # Both devices run the Autodiff decorator, over different inner backends.
    source, target = NDARRAY.autodiff(), ember.device("torch").autodiff()
    model = net(source).fork(target)
    assert model.devices() == [target]
    np.testing.assert_array_equal(values(model)["blocks.1.scale"], [3.0, 3.0, 3.0])
    grads = model(Tensor.ones([3], target)).sum().backward()
    assert model.blocks[1].shift.val().grad(grads).device == ember.device("torch")
    back = model.to_device(source)
    assert back.devices() == [source]


def test_devices_lists_each_device_once():
    mixed = Net(**{**vars(net(NDARRAY)), "offset": Tensor.ones([3], ember.device("torch"))})
    assert mixed.devices() == [NDARRAY, ember.device("torch")]


def test_running_state_updates_in_place_and_detaches():
    device = NDARRAY.autodiff()
    state = RunningState(Tensor.zeros([2], device))
    new = Tensor.ones([2], device).require_grad() * 3
    state.update(new)
    assert not state.val().is_require_grad()
    assert state.val().tolist() == [3.0, 3.0]


def test_param_rejects_non_tensors_and_keeps_int_params_untracked():
    with pytest.raises(ArgumentError, match="needs a Tensor, got list"):
        Param([1.0])  # type: ignore[arg-type]
    counts = Param(Tensor.from_data([1, 2], NDARRAY.autodiff()))
    assert not counts.val().is_require_grad()


def test_param_id_round_trips_and_rejects_garbage():
    pid = ParamId.new()
    assert ParamId.parse(str(pid)) == pid and len(str(pid)) == 16
    with pytest.raises(ArgumentError, match="'xyz' is not an id"):
        ParamId.parse("xyz")
    with pytest.raises(ArgumentError, match="not a 64-bit"):
        ParamId(-1)


# ------------------------------------------------------------------ repr
def test_repr_is_a_tree_with_shapes_and_counts():
    text = repr(net(NDARRAY))
    assert text.splitlines()[0] == "Net {"
    assert "  first: Affine {scale: [3], shift: [3], label: 'affine', params: 6}" in text
    assert "  blocks: list {\n    0: Affine {" in text
    assert "  offset: Tensor[3]" in text
    assert "  stats: [3]" in text
    assert text.rstrip().endswith("params: 39\n}")


# ------------------------------------------------------------------ records
def test_into_record_holds_ids_and_data_of_params_only():
    model = net(NDARRAY)
    record = model.into_record()
    assert list(record) == ["first", "blocks", "heads", "pair", "stats"]
    assert record["first"]["scale"]["id"] == str(model.first.scale.id)
    assert isinstance(record["blocks"], list) and isinstance(record["pair"], list)
    assert record["first"]["scale"]["param"] == TensorData(np.full(3, 1.5, np.float32))


def test_load_record_restores_values_and_ids():
    source = net(NDARRAY).map(lambda _, p: p.val() + 10)
    target = net(NDARRAY)
    loaded = target.load_record(source.into_record())
    for path in PATHS:
        np.testing.assert_array_equal(values(loaded)[path], values(source)[path])
    assert [p.id for _, p in loaded.params()] == [p.id for _, p in source.params()]
    np.testing.assert_array_equal(values(target)["first.scale"], [1.5] * 3)  # untouched


def test_load_record_converts_precision_and_keeps_require_grad():
    device = NDARRAY.autodiff()
    record = flatten(net(NDARRAY).into_record())
    as_f16 = {name: data.convert("f16") for name, data in record.items()}
    model = net(device).load_record(ImportedRecord(as_f16))
    assert model.first.scale.dtype.value == "f32"
    assert model.first.scale.val().is_require_grad()
    assert model.devices() == [device]


def test_load_record_onto_another_device():
    torch_device = ember.device("torch")
    model = net(NDARRAY).load_record(net(NDARRAY).into_record(), device=torch_device)
    assert model.devices() == [torch_device, NDARRAY]  # the constant stays where it was


def test_strict_load_names_every_problem():
    record = net(NDARRAY).into_record()
    del record["blocks"][1]["shift"]
    record["first"]["scale"]["param"] = TensorData(np.zeros((2, 3), np.float32))
    record["heads"]["right"] = {"scale": TensorData([1.0])}
    record["pair"][0]["shift"]["param"] = TensorData([1, 2, 3])
    with pytest.raises(RecordMismatchError) as info:
        net(NDARRAY).load_record(record)
    message = str(info.value)
    assert "first.scale: shape [2, 3] in the record, [3] in the module" in message
    assert "pair.0.shift: dtype i64 (Int) in the record, f32 (Float) in the module" in message
    assert "blocks.1.shift: missing from the record" in message
    assert "heads.right.scale: in the record but not in the module" in message
    assert info.value.path == "first.scale"


def test_partial_load_reports_and_still_rejects_shape_mismatch():
    record = net(NDARRAY).map(lambda _, p: p.val() * 0 + 7).into_record()
    del record["heads"]
    record["decoder"] = {"weight": {"id": str(ParamId.new()), "param": TensorData([1.0])}}
    model, report = net(NDARRAY).load_record_partial(record)
    assert report.missing == ["heads.left.scale", "heads.left.shift"]
    assert report.unexpected == ["decoder.weight"]
    assert len(report.loaded) == len(PATHS) - 2
    assert values(model)["first.scale"].tolist() == [7.0] * 3
    assert values(model)["heads.left.scale"].tolist() == [-1.0] * 3
    assert "missing: heads.left.scale, heads.left.shift" in str(report)
    record["first"]["scale"]["param"] = TensorData(np.zeros(4, np.float32))
    with pytest.raises(RecordMismatchError, match=r"first.scale: shape \[4\] in the record, \[3\]"):
        net(NDARRAY).load_record_partial(record)


def test_record_of_the_wrong_structure():
    with pytest.raises(RecordMismatchError, match="first: the record holds a tensor of shape"):
        net(NDARRAY).load_record({**net(NDARRAY).into_record(), "first": TensorData([1.0])})
    with pytest.raises(RecordMismatchError, match=r"first\.scale: the record holds a str, not a tensor"):
        record = net(NDARRAY).into_record()
        record["first"]["scale"] = "oops"
        net(NDARRAY).load_record(record)


def test_optional_submodule_absent_or_present():
    model = net(NDARRAY)
    with_extra = Net(**{**vars(model), "extra": affine(NDARRAY, 9.0)})
    record = with_extra.into_record()
    assert "extra" in record and "extra" not in model.into_record()
    with pytest.raises(RecordMismatchError, match=r"extra\.scale: in the record but not in the module"):
        model.load_record(record)
    loaded = with_extra.load_record(record)
    assert values(loaded)["extra.scale"].tolist() == [9.0] * 3


def test_imported_flat_names_nest_into_lists():
    model = net(NDARRAY)
    flat = flatten(model.map(lambda _, p: p.val() - 1).into_record())
    assert "blocks.1.scale" in flat
    loaded = net(NDARRAY).load_record(ImportedRecord(flat))
    np.testing.assert_array_equal(values(loaded)["blocks.1.scale"], [2.0] * 3)
    # imported weights carry no ids: the module keeps its own
    target = net(NDARRAY)
    assert target.load_record(ImportedRecord(flat)).first.scale.id == target.first.scale.id


def test_a_mapped_module_does_not_share_running_states():
    model = net(NDARRAY)
    for copy in (model.no_grad(), model.map(lambda _, p: p)):
        copy.stats.update(Tensor.ones([3], NDARRAY))
        assert model.stats.val().tolist() == [0.0, 0.0, 0.0]
        assert copy.stats.id == model.stats.id
