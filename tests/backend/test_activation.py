"""Conformance: every function of ``ember.activation`` against ``torch.nn.functional``.

f64 is compared tightly, f32 with the suite's tolerances, f16/bf16 loosely (ember's
composites round every intermediate step to the narrow dtype, PyTorch computes in f32).
``quiet_softmax`` has no PyTorch counterpart: it is checked against its formula in NumPy
float64.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from reference import TOLERANCE, TORCH_DTYPE, assert_close, from_torch

import ember
from ember import DType, Tensor, activation

LOOSE = {DType.F16: (1e-2, 1e-2), DType.BF16: (6e-2, 6e-2)}
DTYPES = [DType.F64, DType.F32, DType.F16, DType.BF16]
# name: (ember function, torch function)
UNARY: dict[str, tuple[Callable, Callable]] = {
    "relu": (activation.relu, F.relu),
    "relu6": (activation.relu6, F.relu6),
    "leaky_relu": (activation.leaky_relu, F.leaky_relu),
    "leaky_relu_0.2": (lambda x: activation.leaky_relu(x, 0.2), lambda t: F.leaky_relu(t, 0.2)),
    "sigmoid": (activation.sigmoid, torch.sigmoid),
    "log_sigmoid": (activation.log_sigmoid, F.logsigmoid),
    "hard_sigmoid": (activation.hard_sigmoid, F.hardsigmoid),
    "silu": (activation.silu, F.silu),
    "hard_swish": (activation.hard_swish, F.hardswish),
    "mish": (activation.mish, F.mish),
    "gelu": (activation.gelu, F.gelu),
    "gelu_tanh": (lambda x: activation.gelu(x, approximate="tanh"), lambda t: F.gelu(t, approximate="tanh")),
    "elu": (activation.elu, F.elu),
    "elu_0.5": (lambda x: activation.elu(x, alpha=0.5), lambda t: F.elu(t, alpha=0.5)),
    "celu": (activation.celu, F.celu),
    "celu_2": (lambda x: activation.celu(x, alpha=2.0), lambda t: F.celu(t, alpha=2.0)),
    "celu_-0.5": (lambda x: activation.celu(x, alpha=-0.5), lambda t: F.celu(t, alpha=-0.5)),
    "selu": (activation.selu, F.selu),
    "softplus": (activation.softplus, F.softplus),
    "softplus_beta2_th5": (lambda x: activation.softplus(x, beta=2.0, threshold=5.0),
                           lambda t: F.softplus(t, beta=2.0, threshold=5.0)),
    "softplus_beta0.5_th1": (lambda x: activation.softplus(x, beta=0.5, threshold=1.0),
                             lambda t: F.softplus(t, beta=0.5, threshold=1.0)),
    "tanh": (activation.tanh, torch.tanh),
}  # fmt: skip
SOFTMAXES = {
    "softmax": (activation.softmax, F.softmax),
    "log_softmax": (activation.log_softmax, F.log_softmax),
    "softmin": (activation.softmin, F.softmin),
}
# Kinks and thresholds of the functions above, and ordinary values around them.
SPECIAL = [-10.0, -6.0, -3.0, -2.5, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.5, 3.0, 5.0, 6.0, 10.0, 25.0]
EXTREME = [-1e4, -1e3, -100.0, -50.0, -30.0, 30.0, 50.0, 100.0, 1e3, 1e4]


def tolerance(dtype: DType) -> tuple[float, float]:
    return LOOSE.get(dtype, TOLERANCE[dtype])


def inputs(shape, dtype: DType, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    """Normal samples (times ``scale``), exactly representable in ``dtype``."""
    values = torch.from_numpy(
        np.asarray(np.random.default_rng(seed).standard_normal(shape) * scale)
    )
    return values.to(TORCH_DTYPE[dtype])


def check(ours: Callable, theirs: Callable, t: torch.Tensor, device, tol=None) -> None:
    """``ours`` on the ember copy of ``t`` against ``theirs`` on ``t`` (computed in f32 for
    f16/bf16, the way PyTorch's CPU kernels do, then rounded)."""
    dtype = from_torch(t, device).dtype
    rtol, atol = tol or tolerance(dtype)
    wide = t.double() if dtype is DType.F64 else t.float()
    expected = theirs(wide).to(t.dtype)
    assert_close(ours(from_torch(t, device)), expected, rtol=rtol, atol=atol)


# ================================================================ element-wise
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", UNARY)
def test_unary_random(device, name, dtype):
    ours, theirs = UNARY[name]
    check(ours, theirs, inputs((4, 25), dtype), device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", UNARY)
def test_unary_special_points(device, name, dtype):
    ours, theirs = UNARY[name]
    check(ours, theirs, torch.tensor(SPECIAL).to(TORCH_DTYPE[dtype]), device)


@pytest.mark.parametrize("dtype", [DType.F64, DType.F32], ids=str)
@pytest.mark.parametrize("name", UNARY)
def test_unary_extreme_inputs(device, name, dtype):
    ours, theirs = UNARY[name]
    check(ours, theirs, torch.tensor(EXTREME, dtype=TORCH_DTYPE[dtype]), device)


@pytest.mark.parametrize("name", UNARY)
def test_unary_infinities_and_nan(device, name):
    # In f64 PyTorch defines every function at ±inf (NaN where the limit is inf * 0).
    ours, theirs = UNARY[name]
    check(ours, theirs, torch.tensor([-math.inf, math.inf, math.nan], dtype=torch.float64), device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("slope", [0.01, 0.2, 0.0, -0.5, 1.5])
def test_leaky_relu_backward_is_torchs(device, slope, dtype):
    # The backend op the leaky ReLU's rule runs, against aten's: the slope at 0, -0 and for
    # NaN inputs, infinite and NaN gradients.
    x = torch.cat([inputs((64, 80), dtype).reshape(-1), torch.tensor(SPECIAL + [math.nan])
                   .to(TORCH_DTYPE[dtype])])  # fmt: skip
    grad = inputs(x.shape, dtype, seed=1)
    grad[:4] = torch.tensor([math.inf, -math.inf, math.nan, 0.0])
    x_prim, grad_prim = (from_torch(t, device).into_primitive() for t in (x, grad))
    out = Tensor.from_primitive(device.backend.leaky_relu_backward(x_prim, grad_prim, slope), device)
    expected = torch.ops.aten.leaky_relu_backward(grad.double(), x.double(), slope, False)
    assert_close(out, expected.to(x.dtype), *tolerance(out.dtype))


@pytest.mark.parametrize("shape", [(), (0,), (1,), (3, 0, 2), (2, 1, 3, 1)], ids=str)
@pytest.mark.parametrize("name", ["relu", "sigmoid", "gelu", "softplus", "selu", "hard_swish"])
def test_unary_shapes(device, name, shape):
    ours, theirs = UNARY[name]
    check(ours, theirs, inputs(shape, DType.F64), device)


def test_log_sigmoid_large_magnitudes(device):
    x = torch.tensor([-1e4, -800.0, -100.0, -40.0, 40.0, 100.0, 800.0, 1e4], dtype=torch.float64)
    out = activation.log_sigmoid(from_torch(x, device))
    assert_close(out, F.logsigmoid(x))
    # No overflow: log_sigmoid(-x) = -x for large x, and a tiny negative number for large +x.
    assert out.tolist()[:2] == [-1e4, -800.0]
    assert all(math.isfinite(v) for v in out.tolist())


@pytest.mark.parametrize("name", ["relu", "sigmoid", "gelu", "softplus", "mish"])
def test_unary_keeps_input_unchanged(device, name):
    x = from_torch(inputs((3, 4), DType.F32), device)
    before = x.into_data()
    UNARY[name][0](x)
    assert x.into_data() == before


# ================================================================ prelu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("shape", "alpha_shape"),
                         [((2, 3, 4, 5), (1,)), ((2, 3, 4, 5), (3,)), ((4, 6), (6,)), ((4, 6), (1,)),
                          ((7,), (1,)), ((2, 3, 5), (3,)), ((2, 1, 5), (1,))], ids=str)  # fmt: skip
def test_prelu(device, dtype, shape, alpha_shape):
    x = inputs(shape, dtype)
    alpha = (torch.arange(1, alpha_shape[0] + 1, dtype=torch.float64) * 0.25).to(x.dtype)
    check(
        lambda t: activation.prelu(t, from_torch(alpha, device)),
        lambda t: F.prelu(t, alpha.to(t.dtype)),
        x,
        device,
    )


def test_prelu_scalar_alpha(device):
    x = inputs((3, 4), DType.F64)
    out = activation.prelu(from_torch(x, device), Tensor.from_data(0.1, device, dtype="f64"))
    assert_close(out, torch.where(x < 0, 0.1 * x, x))


def test_prelu_alpha_of_another_dtype_is_cast(device):
    x = inputs((2, 3), DType.F64)
    alpha = Tensor.from_data([0.5, 0.25, 2.0], device, dtype="f32")
    assert_close(
        activation.prelu(from_torch(x, device), alpha),
        F.prelu(x, torch.tensor([0.5, 0.25, 2.0], dtype=torch.float64)),
    )


@pytest.mark.parametrize(("shape", "alpha_shape"), [((2, 4, 5), (3,)), ((2, 4), (2,)), ((6,), (6,)), ((2, 4), (1, 4))],
                         ids=str)  # fmt: skip
def test_prelu_alpha_shape_mismatch(device, shape, alpha_shape):
    a_text = ", ".join(map(str, alpha_shape))
    x_text = ", ".join(map(str, shape))
    message = rf"prelu: alpha of shape \[{a_text}\] must have 1 element or one per channel \(dim 1\) of input \[{x_text}\]"
    with pytest.raises(ember.ShapeError, match=message):
        activation.prelu(Tensor.zeros(shape, device), Tensor.ones(alpha_shape, device))


# ================================================================ softmax family
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2, -3])
@pytest.mark.parametrize("name", SOFTMAXES)
def test_softmax_family(device, name, dim, dtype):
    ours, theirs = SOFTMAXES[name]
    check(lambda t: ours(t, dim), lambda t: theirs(t, dim), inputs((3, 4, 5), dtype), device)


@pytest.mark.parametrize("shape", [(1,), (6,), (1, 5), (4, 1), (2, 0), (0, 3)], ids=str)
@pytest.mark.parametrize("name", SOFTMAXES)
def test_softmax_family_shapes(device, name, shape):
    ours, theirs = SOFTMAXES[name]
    for dim in range(-len(shape), len(shape)):
        check(
            lambda t, d=dim: ours(t, d),
            lambda t, d=dim: theirs(t, d),
            inputs(shape, DType.F64),
            device,
        )


@pytest.mark.parametrize("dtype", [DType.F64, DType.F32], ids=str)
@pytest.mark.parametrize("name", SOFTMAXES)
def test_softmax_family_extreme_inputs(device, name, dtype):
    ours, theirs = SOFTMAXES[name]
    rows = [[1e4, -1e4, 0.0], [-1e4, -1e4 + 1, -1e4 + 2], [1e4, 1e4, 1e4], [0.0, -math.inf, 1.0],
            [-math.inf, -math.inf, 0.0], [500.0, 0.0, -500.0]]  # fmt: skip
    check(
        lambda t: ours(t, 1),
        lambda t: theirs(t, 1),
        torch.tensor(rows, dtype=TORCH_DTYPE[dtype]),
        device,
    )


def test_softmax_sums_to_one(device):
    x = from_torch(inputs((5, 7), DType.F64, scale=30.0), device)
    assert_close(activation.softmax(x, -1).sum_dim(-1), torch.ones(5, 1, dtype=torch.float64))
    assert_close(activation.softmin(x, 0).sum_dim(0), torch.ones(1, 7, dtype=torch.float64))


def quiet_softmax_reference(x: np.ndarray, dim: int) -> np.ndarray:
    """``exp(x - max) / (exp(-max) + sum exp(x - max))`` in float64."""
    with np.errstate(over="ignore"):
        peak = x.max(axis=dim, keepdims=True)
        e = np.exp(x - peak)
        return e / (np.exp(-peak) + e.sum(axis=dim, keepdims=True))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dim", [0, 1, -1, -2])
def test_quiet_softmax(device, dim, dtype):
    x = inputs((4, 6), dtype)
    expected = quiet_softmax_reference(x.double().numpy(), dim)
    rtol, atol = tolerance(dtype)
    assert_close(
        activation.quiet_softmax(from_torch(x, device), dim), expected, rtol=rtol, atol=atol
    )


@pytest.mark.parametrize("dtype", [DType.F64, DType.F32], ids=str)
def test_quiet_softmax_extreme_inputs(device, dtype):
    rows = [[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4], [-800.0, -801.0, -799.0], [30.0, 0.0, -30.0],
            [-math.inf, 0.0, 1.0], [0.0, 0.0, 0.0]]  # fmt: skip
    x = torch.tensor(rows, dtype=TORCH_DTYPE[dtype])
    expected = quiet_softmax_reference(x.double().numpy(), 1)
    out = activation.quiet_softmax(from_torch(x, device), 1)
    assert_close(out, expected)
    # A row of very negative scores attends to (almost) nothing; a zero row sums to 3/4.
    sums = out.sum_dim(1).tolist()
    assert sums[1] == [0.0]
    assert sums[5][0] == pytest.approx(0.75)


def test_quiet_softmax_empty(device):
    assert activation.quiet_softmax(Tensor.zeros([3, 0], device), 1).shape == (3, 0)


def rejects_0d_dim(name: str, call: Callable) -> bool:
    """Whether ``call`` rejects dim 0 of a 0-d tensor. The project has not settled whether a
    0-d tensor has a dim 0 (PyTorch says yes); either way the answer must be consistent."""
    try:
        call()
    except ember.ArgumentError as err:
        assert f"{name}: dim 0 is out of range for a tensor of rank 0" in str(err)
        return True
    return False


@pytest.mark.parametrize("name", [*SOFTMAXES, "quiet_softmax"])
def test_softmax_family_0d(device, name):
    x = torch.tensor(0.7, dtype=torch.float64)
    ours = getattr(activation, name)
    if rejects_0d_dim(name, lambda: ours(from_torch(x, device), 0)):
        return
    # A 0-d tensor is one element along dim 0, as in PyTorch; quiet_softmax is then sigmoid.
    theirs = SOFTMAXES[name][1] if name in SOFTMAXES else lambda t, _: torch.sigmoid(t)
    check(lambda t: ours(t, 0), lambda t: theirs(t, 0), x, device)


def test_glu_0d(device):
    # One element along dim 0 (odd), or no dim 0 at all: rejected either way, naming glu.
    pattern = (
        r"glu: dim 0 (is out of range for a tensor of rank 0|of shape \[1\] must have an even size)"
    )
    with pytest.raises((ember.ArgumentError, ember.ShapeError), match=pattern):
        activation.glu(Tensor.from_data(1.0, device), 0)


# ================================================================ glu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("shape", "dim"), [((4, 6), -1), ((4, 6), 0), ((2, 4, 3), 1), ((2, 4, 3), -2),
                                            ((8,), 0), ((3, 2), 1), ((2, 0), 1), ((0, 4), -1)],
                         ids=str)  # fmt: skip
def test_glu(device, dtype, shape, dim):
    check(lambda t: activation.glu(t, dim), lambda t: F.glu(t, dim), inputs(shape, dtype), device)


def test_glu_default_dim_is_last(device):
    check(activation.glu, F.glu, inputs((3, 4), DType.F64), device)


@pytest.mark.parametrize(("shape", "dim", "normalized"), [((2, 3), -1, 1), ((5, 4), 0, 0), ((1,), 0, 0)],
                         ids=str)  # fmt: skip
def test_glu_odd_size(device, shape, dim, normalized):
    text = ", ".join(map(str, shape))
    with pytest.raises(
        ember.ShapeError, match=rf"glu: dim {normalized} of shape \[{text}\] must have an even size"
    ):
        activation.glu(Tensor.zeros(shape, device), dim)


# ================================================================ bad arguments
def test_gelu_bad_approximation(device):
    with pytest.raises(
        ember.ArgumentError, match="gelu: approximate must be 'none' or 'tanh', got 'bad'"
    ):
        activation.gelu(Tensor.zeros([2], device), approximate="bad")


def test_celu_zero_alpha(device):
    with pytest.raises(ember.ArgumentError, match="celu: alpha must not be zero"):
        activation.celu(Tensor.zeros([2], device), alpha=0.0)


@pytest.mark.parametrize("beta", [0.0, -1.0])
def test_softplus_non_positive_beta(device, beta):
    with pytest.raises(ember.ArgumentError, match=f"softplus: beta must be positive, got {beta}"):
        activation.softplus(Tensor.zeros([2], device), beta=beta)


@pytest.mark.parametrize("name", [*SOFTMAXES, "quiet_softmax", "glu"])
@pytest.mark.parametrize(("shape", "dim"), [((2, 4), 2), ((2, 4), -3), ((), 1)], ids=str)
def test_dim_out_of_range(device, name, shape, dim):
    with pytest.raises(
        ember.ArgumentError,
        match=rf"{name}: dim {dim} is out of range for a tensor of rank {len(shape)}",
    ):
        getattr(activation, name)(Tensor.zeros(shape, device), dim)


@pytest.mark.parametrize("kind", [ember.Int, ember.Bool])
@pytest.mark.parametrize("name", ["relu", "sigmoid", "gelu", "softplus", "softmax", "glu", "prelu"])
def test_non_float_input(device, name, kind):
    x = Tensor.zeros([2, 4], device, kind=kind)
    call = {
        "softmax": lambda: activation.softmax(x, 1),
        "glu": lambda: activation.glu(x, 1),
        "prelu": lambda: activation.prelu(x, Tensor.ones([1], device)),
    }.get(name, lambda: getattr(activation, name)(x))
    with pytest.raises(
        ember.KindError, match=rf"{name} is not defined for {kind.value} tensors \(only Float\)"
    ):
        call()
