"""ImportedRecord: key remapping, nesting of dotted names, adapters."""

from __future__ import annotations

import pytest

import ember
from ember import Tensor, TensorData
from ember.backend.errors import ArgumentError, RecordFormatError
from ember.module import Module, Param
from ember.record.adapter import Adapter
from ember.record.imported import ImportedRecord, flatten, nest

NDARRAY = ember.device("ndarray")


def test_key_remap_with_dollar_groups_as_in_the_book():
    record = ImportedRecord({"conv.conv1.weight": 1, "conv.conv2.weight": 2, "head.bias": 3})
    remapped = record.with_key_remap(r"conv\.(.*)", "$1")
    assert remapped.names() == ["conv1.weight", "conv2.weight", "head.bias"]
    assert record.names() == ["conv.conv1.weight", "conv.conv2.weight", "head.bias"]  # unchanged


def test_key_remaps_apply_in_order_and_support_named_groups():
    record = ImportedRecord({"model.layer1.w": 1}).with_key_remap(r"^model\.", "")
    record = record.with_key_remap(r"layer(?P<n>\d+)", "layers.${n}")
    assert record.names() == ["layers.1.w"]
    assert ImportedRecord({"a.b": 1}).with_key_remap(r"(a)\.(b)", r"\2.\1").names() == ["b.a"]


def test_bad_remaps_are_argument_errors():
    with pytest.raises(ArgumentError, match=r"bad pattern '\('"):
        ImportedRecord({}).with_key_remap("(", "x")
    with pytest.raises(ArgumentError, match=r"replacement '\$2' does not fit"):
        ImportedRecord({"ab": 1}).with_key_remap("(a)", "$2").names()


def test_remap_that_merges_two_names_is_an_error():
    record = ImportedRecord({"a.w": 1, "b.w": 2}, source="weights.pt").with_key_remap(r"^[ab]\.", "")
    with pytest.raises(RecordFormatError, match="two tensors are renamed to 'w'") as info:
        record.tree()
    assert info.value.file == "weights.pt"


def test_nest_and_flatten_are_inverse():
    flat = {"a.b.c": TensorData([1.0]), "a.d": TensorData([2.0]), "e": TensorData([3.0])}
    tree = nest(flat.items())
    assert tree == {"a": {"b": {"c": flat["a.b.c"]}, "d": flat["a.d"]}, "e": flat["e"]}
    assert flatten(tree) == flat


@pytest.mark.parametrize("names", [["a", "a.b"], ["a.b", "a"]])
def test_a_name_that_is_also_a_prefix_is_an_error(names):
    with pytest.raises(RecordFormatError, match="tensor names clash"):
        nest((name, TensorData([1.0])) for name in names)


class Scale(Module):
    w: Param


class Outer(Module):
    inner: Scale
    other: Scale


def test_adapter_rule_applies_to_its_module_class_only():
    adapter = Adapter("test")

    @adapter.register(Scale)
    def rename(module, record):
        return {"w" if name == "weight" else name: value for name, value in record.items()}

    model = Outer(Scale(Param(Tensor.zeros([2], NDARRAY))), Scale(Param(Tensor.zeros([2], NDARRAY))))
    record = ImportedRecord(
        {"inner.weight": TensorData([1.0, 2.0]), "other.w": TensorData([3.0, 4.0])}, adapter=adapter
    )
    loaded = model.load_record(record)
    assert loaded.inner.w.val().tolist() == [1.0, 2.0]
    assert loaded.other.w.val().tolist() == [3.0, 4.0]
    assert adapter.adapt(model, {"weight": 1}) == {"weight": 1}  # no rule for Outer
    assert repr(adapter) == "Adapter('test')"
