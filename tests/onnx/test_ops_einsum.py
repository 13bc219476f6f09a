"""ONNX Einsum against NumPy's einsum: diagonals, sums, products of two and three operands,
ellipses that broadcast, implicit outputs and dynamic dims, on NdArray and Torch."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
from onnx import TensorProto, helper  # noqa: E402

import ember  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.onnx.importer import convert  # noqa: E402
from ember.onnx.registry import UnsupportedOnnxError  # noqa: E402

DEVICES = {"ndarray": lambda: ember.device("ndarray"), "torch": lambda: ember.device("torch")}


@pytest.fixture(params=list(DEVICES))
def device(request):
    return DEVICES[request.param]()


def _einsum_model(equation: str, shapes: list[list[int | str]]):
    names = [f"x{i}" for i in range(len(shapes))]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in zip(names, shapes)]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    graph = helper.make_graph([node], "einsum", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])


CASES = [
    ("ij,jk->ik", [[3, 4], [4, 5]]),
    ("bij,bkj->bik", [[2, 3, 4], [2, 5, 4]]),
    ("i,j->ij", [[3], [4]]),
    ("ii->", [[4, 4]]),
    ("ii", [[4, 4]]),
    ("iij->ji", [[3, 3, 2]]),
    ("ij->", [[3, 4]]),
    ("ij,ij->ij", [[3, 4], [3, 4]]),
    ("ij,ij", [[3, 4], [3, 4]]),
    ("...ij,...jk", [[2, 1, 3, 4], [5, 4, 2]]),
    ("abc,cd,de->abe", [[2, 3, 4], [4, 5], [5, 6]]),
    ("ijk,ikl->jl", [[2, 3, 4], [2, 4, 5]]),
    ("b...i,i->b...", [[2, 3, 4, 5], [5]]),
    ("ba,ca->abc", [[3, 4], [2, 4]]),
]  # fmt: skip


@pytest.mark.parametrize(("equation", "shapes"), CASES, ids=[c[0] for c in CASES])
def test_einsum_matches_numpy(equation, shapes, device):
    rng = np.random.default_rng(len(equation))
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    built = convert(_einsum_model(equation, shapes)).build(device)
    got = built(*(Tensor.from_data(a, device) for a in arrays)).to_numpy()
    want = np.einsum(equation, *arrays)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_dynamic_dims_are_read_at_run_time(device):
    model = _einsum_model("bij,bjk->bik", [["batch", "n", 4], ["batch", 4, "m"]])
    built = convert(model).build(device)
    rng = np.random.default_rng(1)
    for batch, n, m in ((2, 3, 5), (4, 1, 2)):
        a = rng.standard_normal((batch, n, 4)).astype(np.float32)
        b = rng.standard_normal((batch, 4, m)).astype(np.float32)
        got = built(Tensor.from_data(a, device), Tensor.from_data(b, device)).to_numpy()
        np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-5)


def test_dynamic_dims_in_a_merged_reshape(device):
    model = _einsum_model("abc,cd->abd", [["batch", 3, 4], [4, "m"]])
    conversion = convert(model)
    assert "x0.shape[0] * 3" in conversion.source  # the merged rows, sized at run time
    built = conversion.build(device)
    rng = np.random.default_rng(2)
    a = rng.standard_normal((5, 3, 4)).astype(np.float32)
    b = rng.standard_normal((4, 2)).astype(np.float32)
    got = built(Tensor.from_data(a, device), Tensor.from_data(b, device)).to_numpy()
    np.testing.assert_allclose(got, np.einsum("abc,cd->abd", a, b), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("equation", "match"), [
    ("ij,jk", "2 operands for 1 inputs"),
    ("i$j", "has the character"),
    ("ij->ik", "has letters no operand has"),
    ("ijk", "does not fit an operand of rank 2"),
])  # fmt: skip
def test_bad_equations_are_reported(equation, match):
    with pytest.raises(UnsupportedOnnxError, match=match):
        convert(_einsum_model(equation, [[3, 4]]))
