"""Dynamic axes: sizes that follow a dynamic dim are not baked into the exported graph.

Each model here derives a shape attribute from a dynamic dim in another way (a reshape
with one or two changing entries, a filled tensor, a range, a slice to the end, an
expand, a slice assignment, a variance's count); each is exported at one size and run in onnxruntime and the importer at others.
"""

from __future__ import annotations

import pytest

onnx = pytest.importorskip("onnx", reason="ONNX export needs the onnx package (ember[onnx])")
pytest.importorskip("onnxruntime")

from export_helpers import rand, round_trip  # noqa: E402

from ember import Tensor  # noqa: E402
from ember.module import Module  # noqa: E402


class MergeAndSplit(Module):
    """``[b, s, d] -> [b * s, d] -> [b, s, d]``: two changing entries need the formula."""

    def forward(self, x: Tensor) -> Tensor:
        b, s, d = x.shape
        flat = x.reshape([b * s, d]) * 2.0
        return flat.reshape([b, s, d]) + 1.0


class FilledAndRange(Module):
    """A zeros tensor of the input's batch and a range over its sequence."""

    def forward(self, x: Tensor) -> Tensor:
        b, s, d = x.shape
        positions = Tensor.arange(0, s, device=x.device).float().reshape([1, s, 1])
        return x + Tensor.zeros([b, s, d], x.device) + positions


class SliceToTheEnd(Module):
    """Everything but the first position, and the first half of the features."""

    def forward(self, x: Tensor) -> Tensor:
        return x[:, 1:, : x.shape[2] // 2]


class ExpandToTheBatch(Module):
    """A per-feature vector broadcast to the batch by an explicit expand."""

    scale: Tensor

    def forward(self, x: Tensor) -> Tensor:
        b, s, d = x.shape
        return x * self.scale.reshape([1, 1, d]).expand([b, s, d])


class FillAColumn(Module):
    """Every row's second and third features set (a slice assignment over the batch)."""

    def forward(self, x: Tensor) -> Tensor:
        return x.slice_fill([(0, x.shape[0]), (0, x.shape[1]), (1, 3)], 7.0)


class VarianceOverTheSequence(Module):
    """A variance (unbiased) and a mean along the dynamic sequence dim."""

    def forward(self, x: Tensor) -> Tensor:
        variance, mean = x.var_mean(1)
        return variance + mean


MODELS = {
    "variance_over_the_sequence": lambda: VarianceOverTheSequence(),
    "fill_a_column": lambda: FillAColumn(),
    "merge_and_split": lambda: MergeAndSplit(),
    "filled_and_range": lambda: FilledAndRange(),
    "slice_to_the_end": lambda: SliceToTheEnd(),
    "expand_to_the_batch": lambda: ExpandToTheBatch(rand(4, seed=9)),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_sizes_follow_the_dynamic_axes(name, tmp_path):
    model = MODELS[name]()
    exported = round_trip(model, [rand(2, 3, 4)], tmp_path / "m.onnx",
                          others=[[rand(5, 7, 4, seed=1)], [rand(1, 2, 4, seed=2)]],
                          dynamic_axes={"input": {0: "batch", 1: "seq"}})  # fmt: skip
    dims = exported.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == ["batch", "seq", 4]


def test_the_same_dim_name_on_two_inputs_is_one_size(tmp_path):
    class Add(Module):
        def forward(self, a: Tensor, b: Tensor) -> Tensor:
            n = a.shape[0]
            return (a + b).reshape([n, 2, 2])

    round_trip(Add(), [rand(3, 4), rand(3, 4, seed=1)], tmp_path / "m.onnx",
               others=[[rand(6, 4, seed=2), rand(6, 4, seed=3)]],
               input_names=["a", "b"], dynamic_axes={"a": {0: "n"}, "b": {0: "n"}})  # fmt: skip


def test_output_dims_take_the_names_given(tmp_path):
    model = MergeAndSplit()
    exported = round_trip(model, [rand(2, 3, 4)], tmp_path / "m.onnx", importer=False,
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "rows"}})  # fmt: skip
    dims = exported.graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == ["rows", 3, 4]


def test_a_size_an_op_bakes_in_must_not_be_dynamic(tmp_path):
    """An adaptive pool's windows follow from its input size."""
    from ember import nn
    from ember.onnx.export import ExportError, export

    pool = nn.AdaptiveAvgPool2dConfig([2, 2]).init()
    with pytest.raises(ExportError, match="bakes in the sizes \\[4, 4\\]"):
        export(pool, rand(1, 2, 4, 4), tmp_path / "p.onnx",
               dynamic_axes={"input": {2: "height", 3: "width"}})  # fmt: skip
    global_pool = nn.AdaptiveAvgPool2dConfig([1, 1]).init()  # a global pool has no windows
    round_trip(global_pool, [rand(1, 2, 4, 4)], tmp_path / "g.onnx",
               others=[[rand(2, 2, 7, 3, seed=1)]],
               dynamic_axes={"input": {0: "batch", 2: "height", 3: "width"}})  # fmt: skip
