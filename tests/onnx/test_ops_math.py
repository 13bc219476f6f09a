"""ONNX math converters on hand-built models: forms the node suite leaves out (constant
bounds and exponents written as literals, legacy opsets, unsupported casts) and Bernoulli,
whose samples only statistics can check."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
from onnx import TensorProto, helper  # noqa: E402
from op_helpers import graph_model as _model  # noqa: E402
from op_helpers import run_model as _run  # noqa: E402

import ember  # noqa: E402
from ember.onnx.importer import convert  # noqa: E402
from ember.onnx.registry import UnsupportedOnnxError  # noqa: E402

RNG = np.random.default_rng(11)
F32, I32 = TensorProto.FLOAT, TensorProto.INT32


def test_cast_opset1_takes_the_type_name():
    model = _model([helper.make_node("Cast", ["x"], ["y"], to="DOUBLE")],
                   [("x", F32, [3])], [("y", TensorProto.DOUBLE, [3])], opset=1)
    x = np.array([1.5, -2.25, 3.0], np.float32)
    _, y = _run(model, x)
    assert y.to_numpy().dtype == np.float64
    np.testing.assert_array_equal(y.to_numpy(), x.astype(np.float64))


def test_cast_to_a_type_ember_lacks_says_so():
    model = _model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.COMPLEX64)],
                   [("x", F32, [3])], [("y", TensorProto.COMPLEX64, [3])])
    with pytest.raises(UnsupportedOnnxError, match=r"COMPLEX64 has no ember dtype"):
        convert(model)


# Edge values for the low-precision casts: overflow, infinities, NaN, f32 subnormals, ties.
EDGES = np.array([0.0, -0.0, 1e-40, 2.0**-127, 3e-39, 2.0**-126, 0.3, 1.5, -3.0, 3.5, 6.0, 7.0,
                  300.0, 449.0, 1e6, -1e6, 2.0**127 * 1.5, np.inf, -np.inf, np.nan], np.float32)


def _onnx_reference(model, x):
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, {"x": x})[0]


@pytest.mark.parametrize("target", [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ,
                                    TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ,
                                    TensorProto.FLOAT4E2M1])  # fmt: skip
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_to_low_precision_floats_saturates_as_onnx(target, saturate):
    model = _model([helper.make_node("Cast", ["x"], ["y"], to=target, saturate=saturate)],
                   [("x", F32, [EDGES.size])], [("y", target, [EDGES.size])], opset=25)
    expected = _onnx_reference(model, EDGES)
    _, y = _run(model, EDGES)
    assert y.to_numpy().dtype == expected.dtype
    np.testing.assert_array_equal(y.to_numpy().astype(np.float32), expected.astype(np.float32))


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_to_e8m0_rounds_the_exponent_as_onnx(round_mode, saturate):
    e8m0 = TensorProto.FLOAT8E8M0
    model = _model([helper.make_node("Cast", ["x"], ["y"], to=e8m0, saturate=saturate,
                                     round_mode=round_mode)],
                   [("x", F32, [EDGES.size])], [("y", e8m0, [EDGES.size])], opset=25)  # fmt: skip
    expected = _onnx_reference(model, EDGES)
    _, y = _run(model, EDGES)
    np.testing.assert_array_equal(y.to_numpy().astype(np.float32), expected.astype(np.float32))


def test_cast_of_a_constant_ember_lacks_a_type_for_happens_at_import():
    nodes = [helper.make_node("Cast", ["c"], ["ci"], to=TensorProto.INT64),
             helper.make_node("Add", ["x", "ci"], ["y"])]  # fmt: skip
    model = _model(nodes, [("x", TensorProto.INT64, [3])], [("y", TensorProto.INT64, [3])],
                   [("c", np.array([1, 2, 4_000_000_000], np.uint32))])
    x = np.array([10, 20, 30], np.int64)
    np.testing.assert_array_equal(_run(model, x)[1].to_numpy(), x + [1, 2, 4_000_000_000])


def test_pow_by_a_constant_scalar_is_a_literal():
    model = _model([helper.make_node("Pow", ["x", "e"], ["y"])], [("x", F32, [2, 3])],
                   [("y", F32, [2, 3])], [("e", np.array(3.0, np.float32))])
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    source, y = _run(model, x)
    assert ".pow(3.0)" in source and "Param" not in source
    np.testing.assert_allclose(y.to_numpy(), x**3, rtol=1e-6)
    ints = _model([helper.make_node("Pow", ["x", "e"], ["y"])], [("x", I32, [4])],
                  [("y", I32, [4])], [("e", np.array(2, np.int64))])
    xi = np.array([-3, 0, 2, 7], np.int32)
    source, y = _run(ints, xi)
    assert ".pow(2)" in source and y.to_numpy().dtype == np.int32
    np.testing.assert_array_equal(y.to_numpy(), xi**2)


def test_pow_legacy_broadcast_along_an_axis():
    model = _model([helper.make_node("Pow", ["x", "e"], ["y"], broadcast=1, axis=0)],
                   [("x", F32, [2, 3]), ("e", F32, [2])], [("y", F32, [2, 3])], opset=6)
    x = RNG.uniform(0.5, 2.0, (2, 3)).astype(np.float32)
    e = np.array([2.0, 3.0], np.float32)
    _, y = _run(model, x, e)
    np.testing.assert_allclose(y.to_numpy(), x ** e[:, None], rtol=1e-6)


@pytest.mark.parametrize(("low", "high"), [(-0.5, 0.5), (0.5, -0.5)])
def test_clip_with_constant_bounds(low, high):
    """Constant bounds are literals; with min > max every element becomes max (ONNX)."""
    model = _model([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], [("x", F32, [4, 5])],
                   [("y", F32, [4, 5])],
                   [("lo", np.array(low, np.float32)), ("hi", np.array(high, np.float32))])
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    source, y = _run(model, x)
    assert "Param" not in source
    np.testing.assert_array_equal(y.to_numpy(), np.minimum(np.maximum(x, low), high))


def test_clip_v6_attributes_and_int_clip_with_one_bound():
    v6 = _model([helper.make_node("Clip", ["x"], ["y"], max=0.25)], [("x", F32, [6])],
                [("y", F32, [6])], opset=6)
    x = RNG.standard_normal(6).astype(np.float32)
    np.testing.assert_array_equal(_run(v6, x)[1].to_numpy(), np.minimum(x, 0.25))
    ints = _model([helper.make_node("Clip", ["x", "lo"], ["y"])], [("x", I32, [6])],
                  [("y", I32, [6])], [("lo", np.array(-2, np.int32))])
    xi = np.array([-5, -2, -1, 0, 3, 9], np.int32)
    source, y = _run(ints, xi)
    assert ".clamp_min(-2)" in source
    np.testing.assert_array_equal(y.to_numpy(), np.maximum(xi, -2))


def test_variadic_max_broadcasts_three_inputs():
    model = _model([helper.make_node("Max", ["a", "b", "c"], ["y"])],
                   [("a", F32, [2, 3]), ("b", F32, [3]), ("c", F32, [2, 1])], [("y", F32, [2, 3])])
    a, b, c = (RNG.standard_normal(s).astype(np.float32) for s in ((2, 3), (3,), (2, 1)))
    np.testing.assert_array_equal(_run(model, a, b, c)[1].to_numpy(),
                                  np.maximum(np.maximum(a, b), c))


@pytest.mark.parametrize(("op", "reference", "values"), [
    ("Asinh", np.arcsinh, [-1e6, -3.0, -1e-6, 0.0, 1e-7, 0.5, 20.0, 1e30]),
    ("Acosh", np.arccosh, [1.0, 1.0 + 1e-6, 1.5, 10.0, 1e30]),
    ("Atanh", np.arctanh, [-0.999, -0.5, -1e-7, 0.0, 1e-6, 0.3, 0.9999]),
])  # fmt: skip
def test_inverse_hyperbolic_functions_are_accurate(op, reference, values):
    """Composed from log1p and sqrt: accurate near zero (or one) and without overflow."""
    model = _model([helper.make_node(op, ["x"], ["y"])], [("x", F32, [len(values)])],
                   [("y", F32, [len(values)])])
    x = np.array(values, np.float32)
    expected = reference(x.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(_run(model, x)[1].to_numpy(), expected, rtol=2e-6, atol=0)


def test_bernoulli_samples_with_the_given_probabilities():
    """Bernoulli is random: its rate per element matches the probability, 0 and 1 are exact,
    the ``dtype`` attribute sets the output type, and a constant input is not folded."""
    p = np.array([0.0, 0.2, 0.5, 0.9, 1.0], np.float32)
    n = 4000
    model = _model([helper.make_node("Bernoulli", ["p"], ["y"], dtype=TensorProto.DOUBLE)], [],
                   [("y", TensorProto.DOUBLE, [n, 5])], [("p", np.tile(p, (n, 1)))], opset=15)
    conversion = convert(model)
    assert "Tensor.random(" in conversion.source  # sampled when run, not at import
    module = conversion.build(ember.device("ndarray"))
    first, second = module().to_numpy(), module().to_numpy()
    assert first.dtype == np.float64 and set(np.unique(first)) <= {0.0, 1.0}
    rate = first.mean(axis=0)
    assert rate[0] == 0.0 and rate[-1] == 1.0
    bound = 5 * np.sqrt(p * (1 - p) / n)  # five standard deviations
    assert np.all(np.abs(rate - p) <= bound + 1e-12), (rate, p)
    assert not np.array_equal(first, second)
