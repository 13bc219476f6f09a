"""Totals: a block's float sums over another dim than its axis (``ir.is_total``).

The runtimes against NumPy's float64 sums; the element-wise fuser's rules for taking one
(and what it refuses, each case computed right by the blocks it makes instead); a stored
template's checks; and the layer norm's gradient, whose weight and bias sums over the
batch are its kernel's totals.
"""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Tensor
from ember.backends.fusion import ir
from ember.backends.fusion.elementwise import Template
from ember.backends.fusion.interpreter import InterpreterRuntime
from ember.backends.fusion.ir import Block, Input, Instr, StateError
from ember.backends.fusion.numba_source import KernelUnsupported
from ember.tensor.dtype import DType

F32, F64 = DType.F32, DType.F64
NP = {F32: np.float32, F64: np.float64}


def _runtimes() -> list:
    found = [InterpreterRuntime()]
    from ember.backends.fusion import numba_runtime

    if numba_runtime.available():
        found.append(numba_runtime.NumbaRuntime())
    return found


def _norm_block(shape: tuple[int, ...], dim: int, dtype: DType) -> Block:
    """``y = x * w``, ``y - mean(y)`` along the last dim, and the totals of ``y`` and of
    the input ``x`` over ``dim``."""
    rank = len(shape)
    w_shape = (1,) * (rank - 1) + shape[-1:]
    row = shape[:-1] + (1,)
    summed = tuple(1 if d == dim else n for d, n in enumerate(shape))
    return Block(shape, (Input(shape, dtype), Input(w_shape, dtype)), (
        Instr("mul", (0, 1), (), shape, dtype),               # r2 = y
        Instr("mean_dim", (2,), (rank - 1,), row, dtype),     # r3
        Instr("sub", (2, 3), (), shape, dtype),               # r4
        Instr("sum_dim", (2,), (dim,), summed, dtype),        # r5: y's total
        Instr("sum_dim", (0,), (dim,), summed, dtype),        # r6: x's total
    ), outputs=(4, 5, 6), axis=rank - 1)  # fmt: skip


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize(("shape", "dim"), [((4, 5, 8), 0), ((4, 5, 8), 1), ((3, 4, 5, 6), 1),
                                            ((3, 4, 5, 6), 0), ((7, 33), 0)])  # fmt: skip
def test_totals_equal_numpys_sums(shape, dim, dtype, threads):
    """Each runtime's totals are the float64 sums over the dim (float32 within a few ulp of
    the sum's magnitude), beside the block's other outputs, at one and at two threads."""
    block = _norm_block(shape, dim, dtype)
    rng = np.random.default_rng(len(shape) * 10 + dim)
    x = rng.standard_normal(shape).astype(NP[dtype]) + 3
    w = rng.standard_normal(block.inputs[1].shape).astype(NP[dtype])
    x64, y64 = x.astype(np.float64), x.astype(np.float64) * w.astype(np.float64)
    want = [y64 - y64.mean(-1, keepdims=True), y64.sum(dim, keepdims=True),
            x64.sum(dim, keepdims=True)]  # fmt: skip
    tol = 1e-5 if dtype is F32 else 1e-12
    for runtime in _runtimes():
        kwargs = {"threads": threads} if hasattr(runtime, "thread_count") else {}
        got = runtime.run(block, [x, w], **kwargs)
        for g, want_one, name in zip(got, want, ("centered", "y's total", "x's total")):
            assert g.dtype == NP[dtype] and g.shape == want_one.shape, name
            scale = np.abs(x64).max() * np.abs(w).max() * shape[dim]
            np.testing.assert_allclose(g, want_one, rtol=0, atol=tol * scale,
                                       err_msg=f"{type(runtime).__name__}: {name}")  # fmt: skip


@pytest.mark.parametrize("threads", [1, 2])
def test_a_total_of_an_input_adds_as_numpy_does(threads):
    """A total adds in its dtype, in order along its dim, as NumPy's sum over a leading dim
    does: an input's total has NumPy's bits, and overflows to inf where NumPy's does
    (float32: 3e38 + 3e38 - 3e38)."""
    shape = (5, 6, 16)
    block = _norm_block(shape, 0, F32)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32) * 1e3
    x[:3, 0, 0] = (3e38, 3e38, -3e38)
    w = np.ones((1, 1, 16), np.float32)
    for runtime in _runtimes():
        kwargs = {"threads": threads} if hasattr(runtime, "thread_count") else {}
        with np.errstate(over="ignore", invalid="ignore"):
            x_total = runtime.run(block, [x, w], **kwargs)[2]
            want = x.sum(axis=0, keepdims=True)
        assert want[0, 0, 0] == np.inf
        np.testing.assert_array_equal(x_total, want, err_msg=type(runtime).__name__)


def test_a_total_over_an_empty_dim_is_zero():
    """Nothing to add: the totals are zeros (as NumPy's sum), the other output empty."""
    block = _norm_block((0, 5, 8), 0, F32)
    x = np.zeros((0, 5, 8), np.float32)
    w = np.ones((1, 1, 8), np.float32)
    for runtime in _runtimes():
        centered, y_total, x_total = runtime.run(block, [x, w])
        assert centered.shape == (0, 5, 8)
        for total in (y_total, x_total):
            np.testing.assert_array_equal(total, np.zeros((1, 5, 8), np.float32))


def test_the_numba_kernel_refuses_totals_it_cannot_loop_over():
    """Totals of two dims in one block, or in a block whose axis is not its last dim: a
    clear refusal, never a wrong kernel (the fuser makes neither)."""
    from ember.backends.fusion import numba_source

    shape = (3, 4, 5)
    two = Block(shape, (Input(shape, F32),), (
        Instr("mean_dim", (0,), (2,), (3, 4, 1), F32),
        Instr("sum_dim", (0,), (0,), (1, 4, 5), F32),
        Instr("sum_dim", (0,), (1,), (3, 1, 5), F32),
    ), outputs=(1, 2, 3), axis=2)  # fmt: skip
    with pytest.raises(KernelUnsupported, match="two dims"):
        numba_source.generate(two)
    lanes = Block(shape, (Input(shape, F32),), (
        Instr("mean_dim", (0,), (0,), (1, 4, 5), F32),
        Instr("sum_dim", (0,), (1,), (3, 1, 5), F32),
    ), outputs=(1, 2), axis=0)  # fmt: skip
    with pytest.raises(KernelUnsupported, match="lane mode"):
        numba_source.generate(lanes)


def test_triton_refuses_a_total():
    from ember.backends.fusion import triton_source

    with pytest.raises(triton_source.KernelUnsupported, match="total"):
        triton_source.check(_norm_block((4, 5, 8), 0, F32))


def test_is_total_names_sums_over_another_dim_than_the_axis():
    block = _norm_block((4, 5, 8), 0, F32)
    assert [ir.is_total(i, block.axis) for i in block.body] == [False, False, False, True, True]
    assert not ir.is_total(block.body[3], None)
    assert not ir.is_total(Instr("max_dim", (0,), (0,), (1, 5, 8), F32), 2)


# ---------------------------------------------------------------------- the fuser
def _device():
    pytest.importorskip("numba", reason="the numba runtime needs ember[jit]")
    return ember.device("ndarray").fusion(runtime="numba")


def _both(fn, *arrays) -> list[Block]:
    """``fn`` on fusion(NdArray) and on NdArray, the results compared; returns the blocks
    the fused run launched."""
    from ember.backends.fusion.executor import Executor

    fused_device, plain = _device(), ember.device("ndarray")
    blocks = []
    original = Executor._launch

    def spy(self, fused, *args, **kwargs):
        blocks.append(fused.block)
        return original(self, fused, *args, **kwargs)

    Executor._launch = spy
    try:
        got = [t.to_numpy() for t in fn(*[Tensor.from_data(a, fused_device) for a in arrays])]
    finally:
        Executor._launch = original
    want = [t.to_numpy() for t in fn(*[Tensor.from_data(a, plain) for a in arrays])]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(w).max()))
    return blocks


def _totals(blocks: list[Block]) -> list[int]:
    """Per block, its number of totals; each checked to be read by no instruction."""
    counts = []
    for block in blocks:
        n_in = len(block.inputs)
        totals = {n_in + k for k, i in enumerate(block.body) if ir.is_total(i, block.axis)}
        assert not any(a in totals for i in block.body for a in i.args), block
        assert totals <= set(block.outputs), block
        counts.append(len(totals))
    return counts


def _x(shape=(8, 16, 32), seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_a_rows_block_sums_over_the_batch_as_its_totals():
    """A layer norm's gradient-like block and two sums over dim 0 of values it makes or
    reads: one kernel, the sums equal NdArray's."""

    def fn(x, g):
        centered = x - x.mean_dim(2)
        normed = centered * (centered * centered).mean_dim(2).add_scalar(1e-5).rsqrt()
        return [normed * 2.0, (g * normed).sum_dim(0), g.sum_dim(0)]

    assert _totals(_both(fn, _x(), _x(seed=1))) == [2]


@pytest.mark.parametrize("case", ["read in the block", "broadcast operand", "unit dim",
                                  "two dims", "int", "axis not last", "rows only"])  # fmt: skip
def test_what_the_fuser_leaves_out_of_a_blocks_totals(case):
    """Each sum the fuser must not take as a total runs in a block of its own (or as an
    op); a total read later is read after its kernel; every result equals NdArray's."""
    shape = {"unit dim": (1, 16, 32), "rows only": (8, 32)}.get(case, (8, 16, 32))

    def fn(x, g):
        centered = x - x.mean_dim(-1)
        if case == "rows only":  # no dim left for the kernel's parallel tasks
            return [centered, centered.sum_dim(0)]
        if case == "read in the block":
            total = centered.sum_dim(0)
            return [centered * total]  # the total, read by the same block: complete too late
        if case == "broadcast operand":
            return [centered, x.mean_dim(2).sum_dim(0)]  # not the block's full shape
        if case == "unit dim":
            return [centered, centered.sum_dim(0)]
        if case == "two dims":
            return [centered, centered.sum_dim(0), centered.sum_dim(1)]
        if case == "int":
            return [centered, (centered > 0.0).int().sum_dim(0)]
        return [x.mean_dim(0) - x, x.sum_dim(1)]  # the block reduces dim 0

    totals = _totals(_both(fn, _x(shape), _x(shape, seed=1)))
    assert sum(totals) == (1 if case in ("read in the block", "two dims") else 0), totals


def test_a_plan_with_totals_round_trips_and_a_bad_total_is_refused():
    """A template with totals goes to plain data and back equal; a stored reduction over a
    dim that is neither the axis nor one before the last, or a total in a block whose axis
    is not its last dim, raises ``StateError``."""
    import json

    from ember.backends.fusion import explorer

    device = _device()
    x = Tensor.from_data(_x(), device)
    centered = x - x.mean_dim(2)
    outs = [centered * 3.0, centered.sum_dim(0)]  # one flush: the sum is the block's total
    [t.to_numpy() for t in outs]
    made = [t for built in list(explorer._built.values()) for _, _, t in built]
    fuser = next(f for f in device.backend.executor.explorer.fusers if f.name == "elementwise+totals")
    totals = [t for t in made if isinstance(t, Template) and t.axis is not None
              and any(op == "sum_dim" and fixed[0] != t.axis for op, _, fixed in t.body)]  # fmt: skip
    assert totals and fuser.sums_totals
    state = json.loads(json.dumps(totals[0].to_state()))
    assert Template.from_state(state) == totals[0]
    body = [[op, args, fixed] for op, args, fixed in state["body"]]
    k = next(i for i, (op, _, fixed) in enumerate(body) if op == "sum_dim" and fixed != [state["axis"]])
    for bad in ([state["rank"]], [-1], ["0"], [0, 1]):
        body[k][2] = bad
        with pytest.raises(StateError, match="total"):
            Template.from_state({**state, "body": body})
    body[k][2] = [0]
    with pytest.raises(StateError):
        Template.from_state({**state, "body": body, "axis": 1})


# ---------------------------------------------------------------------- layer norm
def test_a_layer_norms_gradient_sums_its_weight_and_bias_in_its_kernel():
    """``nn.LayerNorm``'s backward on autodiff(fusion): the weight's and the bias's sums over
    the batch are totals of the gradient's kernel, and every gradient equals NdArray's."""
    pytest.importorskip("numba", reason="the numba runtime needs ember[jit]")
    from ember.backends.fusion.executor import Executor
    from ember.nn import LayerNormConfig

    seen = []
    original = Executor._launch

    def spy(self, fused, records, *args, **kwargs):
        seen.append(fused.block)
        return original(self, fused, records, *args, **kwargs)

    x_host, g_host = _x((4, 6, 16)), _x((4, 6, 16), seed=3)
    grads = []
    for device in (ember.device("ndarray").autodiff(),
                   ember.device("ndarray").fusion(runtime="numba").autodiff()):  # fmt: skip
        norm = LayerNormConfig(16).init(device)
        x = Tensor.from_data(x_host, device).require_grad()
        Executor._launch = spy
        try:
            g = (norm(x) * Tensor.from_data(g_host, device)).sum().backward()
            grads.append([t.grad(g).to_numpy() for t in (x, norm.gamma.val(), norm.beta.val())])
        finally:
            Executor._launch = original
    assert any(sum(ir.is_total(i, b.axis) for i in b.body) == 2 for b in seen), seen
    for got, want in zip(grads[1], grads[0], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
