"""The numba runtime against NumPy: random blocks, the fused layers, caching, the pool.

Float kernels are compared with the same block evaluated op by op in float64 by ember's
NdArray backend (float32 kernels within a few float32 ulp, scaled by the inputs for sums);
int and bool kernels must equal NdArray's results in their own dtype exactly.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from ember.backend.errors import BackendUnavailableError, UnsupportedError
from ember.backend.ops import OPS
from ember.backends.fusion import ir
from ember.backends.fusion import numba_runtime as nr
from ember.backends.ndarray.backend import NdArray
from ember.tensor.dtype import DType

if not nr.available():
    pytest.skip("numba is not installed (pip install 'ember[jit]')", allow_module_level=True)

from ember.backends.fusion import numba_math
from ember.backends.fusion.numba_source import KernelUnsupported, generate, layout

F32, F64, I32, I64, I8, U8, BOOL = (DType.F32, DType.F64, DType.I32, DType.I64, DType.I8,
                                    DType.U8, DType.BOOL)  # fmt: skip
NDARRAY = NdArray()
# Each new block structure compiles a kernel (~0.5 s): a fixed set of examples, no shrinking.
BLOCKS = {"deadline": None, "derandomize": True, "phases": (Phase.explicit, Phase.generate)}
NP = {F32: np.float32, F64: np.float64, I32: np.int32, I64: np.int64, I8: np.int8,
      U8: np.uint8, BOOL: np.bool_}  # fmt: skip


# ---------------------------------------------------------------------- the reference
def reference(block: ir.Block, inputs: list[np.ndarray], wide: bool) -> list[np.ndarray]:
    """The block op by op on NdArray; ``wide`` computes float registers in float64."""

    def widen(d: DType) -> DType:
        return F64 if wide and d.is_float else d

    regs = [x.astype(np.float64) if wide and x.dtype.kind == "f" else x for x in inputs]
    for instr in block.body:
        args = [regs[a] for a in instr.args]
        kind = block.register_dtype(instr.args[0]).kind
        attrs = tuple(widen(a) if isinstance(a, DType) else a for a in instr.attrs)
        name = OPS[instr.op].primitive(kind) if instr.op in OPS else instr.op
        with np.errstate(all="ignore"):
            regs.append(np.asarray(getattr(NDARRAY, name)(*args, *attrs)))
    return [regs[r] for r in block.outputs]


def assert_close(got: np.ndarray, want: np.ndarray, ulps: float, scale=None) -> None:
    """Floats within ``ulps`` of the result's dtype (relative to ``scale``, default the
    value itself, with the smallest normal as floor); NaN where NaN; others exact."""
    assert got.shape == want.shape
    if got.dtype.kind != "f":
        np.testing.assert_array_equal(got, want)
        return
    with np.errstate(over="ignore"):
        rounded = want.astype(got.dtype)  # beyond the dtype's range: infinite there too
    with np.errstate(invalid="ignore"):  # NaN payloads cast and compare as NaN, checked below
        want = want.astype(np.float64)
        g = got.astype(np.float64)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(g), nan)
    inf = np.isinf(rounded)
    np.testing.assert_array_equal(got[inf], rounded[inf])
    base = np.abs(want) if scale is None else scale
    eps = np.finfo(got.dtype).eps
    tol = ulps * eps * np.maximum(base, np.finfo(got.dtype).tiny)
    finite = ~nan & ~inf
    with np.errstate(invalid="ignore"):  # inf - inf where both are infinite, checked above
        err = np.abs(g - want)
    worst = np.argmax(np.where(finite, err - tol, -np.inf)) if finite.any() else 0
    assert np.all(err[finite] <= tol[finite]), (
        f"error {err.flat[worst]:.3g} > {tol.flat[worst]:.3g} at {worst}: "
        f"got {g.flat[worst]!r}, want {want.flat[worst]!r}"
    )


def I(op, args, attrs, shape, dtype):  # noqa: E743 (a short name keeps blocks legible)
    return ir.Instr(op, tuple(args), tuple(attrs), tuple(shape), dtype)


# ---------------------------------------------------------------------- approximations
def ulp_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in float32 ulps of ``want`` (float64): the spacing of float32 numbers in
    want's binade, 2**-149 among the subnormals. NaN and infinities are the caller's."""
    _, e = np.frexp(np.abs(want))  # |want| = m 2**e with m in [0.5, 1)
    e = np.where(want == 0, -200, e)
    return np.abs(got.astype(np.float64) - want) / np.ldexp(1.0, np.maximum(e - 24, -149))


def _samples() -> np.ndarray:
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    subnormal = rng.integers(1, 2**23, 10_000, dtype=np.uint32).view(np.float32)
    edges = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754944e-38, 88.72, 88.7229,
             -87.33, -103.9, -104.5, 1.0, -1.0, 0.625, 4.0, 3.92, 3.925, 3.9250002, 10.0, 1e30,
             -1e30, 3.4028235e38, -3.4028235e38, 0.99999994, 1.0000001]  # fmt: skip
    return np.concatenate([
        bits, subnormal, -subnormal, np.linspace(-6, 6, 2_000_001, dtype=np.float32),
        rng.uniform(-12, 12, 300_000).astype(np.float32), np.array(edges, np.float32)])  # fmt: skip


@pytest.mark.parametrize("name", ["exp", "log", "erf", "tanh", "sigmoid"])
def test_approximation_within_stated_ulp(runtime, name):
    x = _samples()
    shape = x.shape
    block = ir.Block(shape, (ir.Input(shape, F32),), (I(name, (0,), (), shape, F32),), (1,))
    (got,) = runtime.run(block, [x])
    with np.errstate(all="ignore"):
        want = numba_math.REFERENCE[name](x.astype(np.float64))
        rounded = want.astype(np.float32)  # beyond float32's range: infinite there too
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    inf = np.isinf(rounded)
    np.testing.assert_array_equal(got[inf], rounded[inf])
    finite = ~np.isnan(want) & ~inf
    err = ulp_error(got[finite], want[finite])
    worst = np.argmax(err)
    assert err[worst] <= numba_math.MAX_ULP[name], (
        f"{name}({x[finite][worst]!r}) = {got[finite][worst]!r}, want {want[finite][worst]!r}: "
        f"{err[worst]:.3f} ulp"
    )
    if name in ("erf", "tanh"):  # odd functions keep the sign of zero
        zeros = x == 0
        np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(x[zeros]))


def _every_float32(lo: float, hi: float, step: int = 1) -> np.ndarray:
    """Every ``step``-th float32 from ``lo`` to ``hi`` (both at least 0), in order."""
    first, last = (int(np.float32(v).view(np.int32)) for v in (lo, hi))
    return np.arange(first, last + 1, step, dtype=np.int32).view(np.float32)


def test_erf_at_every_float_near_its_seams(runtime):
    # the two pieces meet at 0.9375; 3.925 is the clamp; erf is odd to the bit; 1 beyond
    pos = np.concatenate([_every_float32(0.92, 0.96), _every_float32(3.9, 3.95)])
    x = np.concatenate([pos, -pos])
    block = ir.Block(x.shape, (ir.Input(x.shape, F32),), (I("erf", (0,), (), x.shape, F32),), (1,))
    (got,) = runtime.run(block, [x])
    want = np.vectorize(math.erf)(x.astype(np.float64))
    assert ulp_error(got, want).max() <= numba_math.MAX_ULP["erf"]
    np.testing.assert_array_equal(got[pos.size :], -got[: pos.size])
    np.testing.assert_array_equal(got[np.abs(x) > 3.925], np.sign(x[np.abs(x) > 3.925]))


def test_ulp_error_measures_float32_spacing():
    want = np.array([1.0, 1.5, 0.75, 2.0**-130, 0.0, -3.0])
    got = np.array([1.0 + 2.0**-23, 1.5, 0.75 - 2.0**-24, 2.0**-130 + 2.0**-148, 2.0**-149, -3.0])
    np.testing.assert_array_equal(ulp_error(got, want), [1.0, 0.0, 1.0, 2.0, 1.0, 0.0])


# ---------------------------------------------------------------------- random blocks
FLOAT_UNARY = ["exp", "tanh", "erf", "sigmoid", "neg", "abs", "sqrt", "floor", "sign", "sin"]
FLOAT_BINARY = ["add", "mul", "sub", "max_pair", "min_pair"]


@st.composite
def float_programs(draw):
    """A chain of element-wise float ops over 2-3 inputs broadcast against each other."""
    rank = draw(st.integers(1, 3))
    dtype = draw(st.sampled_from([F32, F64]))
    sizes = draw(st.lists(st.integers(1, 9), min_size=rank, max_size=rank))
    shape = tuple(sizes)
    n_inputs = draw(st.integers(1, 3))
    inputs = []
    for _ in range(n_inputs):
        ones = draw(st.lists(st.booleans(), min_size=rank, max_size=rank))
        inputs.append(tuple(1 if o else s for o, s in zip(ones, sizes)))
    inputs[0] = shape
    regs = [(s, dtype) for s in inputs]
    body = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["unary", "binary", "scalar", "clamp", "where"]))
        a = draw(st.integers(0, len(regs) - 1))
        sa = regs[a][0]
        if kind == "unary":
            op = draw(st.sampled_from(FLOAT_UNARY))
            if op == "sqrt":
                body.append(I("abs", (a,), (), sa, dtype))
                regs.append((sa, dtype))
                a = len(regs) - 1
            body.append(I(op, (a,), (), sa, dtype))
            regs.append((sa, dtype))
        elif kind in ("binary", "where"):
            b = draw(st.integers(0, len(regs) - 1))
            out = tuple(max(x, y) for x, y in zip(sa, regs[b][0]))
            if kind == "binary":
                body.append(I(draw(st.sampled_from(FLOAT_BINARY)), (a, b), (), out, dtype))
            else:
                body.append(I("greater", (a, b), (), out, BOOL))
                regs.append((out, BOOL))
                body.append(I("mask_where", (a, len(regs) - 1, b), (), out, dtype))
            regs.append((out, dtype))
        elif kind == "scalar":
            op = draw(st.sampled_from(["add_scalar", "mul_scalar", "sub_scalar", "div_scalar"]))
            value = draw(st.sampled_from([0.5, -1.25, 3.0, 2]))
            body.append(I(op, (a,), (value,), sa, dtype))
            regs.append((sa, dtype))
        else:
            body.append(I("clamp", (a,), (-0.5, draw(st.sampled_from([0.75, None]))), sa, dtype))
            regs.append((sa, dtype))
    outputs = (len(regs) - 1,) if draw(st.booleans()) else (len(regs) - 1, n_inputs)
    block = ir.Block(shape, tuple(ir.Input(s, dtype) for s in inputs), tuple(body), outputs)
    return block, draw(st.integers(0, 2**32 - 1))


def _values(block: ir.Block, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for spec in block.inputs:
        if spec.dtype.is_float:
            out.append((rng.standard_normal(spec.shape) * 2).astype(NP[spec.dtype]))
        elif spec.dtype is BOOL:
            out.append(rng.random(spec.shape) < 0.5)
        else:
            info = np.iinfo(NP[spec.dtype])
            edges = np.array([0, 1, -1, 2, 7, info.min, info.max, -3], dtype=np.int64)
            edges = edges[(edges >= info.min) & (edges <= info.max)]
            picks = rng.integers(0, len(edges), spec.shape)
            small = rng.integers(max(info.min, -20), min(info.max, 20), spec.shape)
            out.append(
                np.where(rng.random(spec.shape) < 0.3, edges[picks], small).astype(NP[spec.dtype])
            )
    return out


@settings(max_examples=25, **BLOCKS)
@given(float_programs())
def test_random_elementwise_float_blocks(runtime, program):
    block, seed = program
    inputs = _values(block, seed)
    got = runtime.run(block, inputs)
    want = reference(block, inputs, wide=True)
    for g, w in zip(got, want):
        # each op adds a rounding; an approximation adds its stated error
        assert_close(g, w, ulps=6 * len(block.body) + 8, scale=np.maximum(np.abs(w), 1.0))


INT_BINARY = ["add", "sub", "mul", "div", "remainder", "max_pair", "min_pair", "bitwise_and",
              "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift"]  # fmt: skip
INT_SCALAR = ["add_scalar", "mul_scalar", "div_scalar", "remainder_scalar", "pow_scalar",
              "bitwise_right_shift_scalar"]  # fmt: skip


@st.composite
def int_programs(draw):
    """Element-wise int and bool ops, edge values included, broadcast over rank 2."""
    dtype = draw(st.sampled_from([I32, I64, I8, U8]))
    shape = (draw(st.integers(1, 6)), draw(st.integers(1, 6)))
    other = draw(st.sampled_from([shape, (1, shape[1]), (shape[0], 1)]))
    inputs = [shape, other]
    body = []
    regs = [(s, dtype) for s in inputs]
    for _ in range(draw(st.integers(1, 4))):
        a, b = draw(st.integers(0, len(regs) - 1)), draw(st.integers(0, len(regs) - 1))
        if regs[a][1] is not dtype or regs[b][1] is not dtype:
            a, b = 0, 1
        kind = draw(st.sampled_from(["binary", "scalar", "unary", "compare"]))
        out = tuple(max(x, y) for x, y in zip(regs[a][0], regs[b][0]))
        if kind == "binary":
            body.append(I(draw(st.sampled_from(INT_BINARY)), (a, b), (), out, dtype))
            regs.append((out, dtype))
        elif kind == "scalar":
            op = draw(st.sampled_from(INT_SCALAR))
            value = draw(st.sampled_from([0, 1, 2, 3, 5] if op != "pow_scalar" else [0, 1, 3]))
            body.append(I(op, (a,), (value,), regs[a][0], dtype))
            regs.append((regs[a][0], dtype))
        elif kind == "unary":
            op = draw(st.sampled_from(["neg", "abs", "sign", "bitwise_not"]))
            body.append(I(op, (a,), (), regs[a][0], dtype))
            regs.append((regs[a][0], dtype))
        else:
            body.append(I("lower", (a, b), (), out, BOOL))
            regs.append((out, BOOL))
            body.append(I("not", (len(regs) - 1,), (), out, BOOL))
            regs.append((out, BOOL))
            body.append(I("mask_fill", (a, len(regs) - 1), (7,), out, dtype))
            regs.append((out, dtype))
    last = len(regs) - 1
    body.append(I("cast", (last,), (F32,), regs[last][0], F32))
    regs.append((regs[last][0], F32))
    block = ir.Block(shape, tuple(ir.Input(s, dtype) for s in inputs), tuple(body),
                     (last, len(regs) - 1))  # fmt: skip
    return block, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=25, **BLOCKS)
@given(int_programs())
def test_random_int_blocks_are_exact(runtime, program):
    block, seed = program
    inputs = _values(block, seed)
    got = runtime.run(block, inputs)
    want = reference(block, inputs, wide=False)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


REDUCE = ["sum_dim", "mean_dim", "max_dim", "min_dim", "prod_dim"]


@st.composite
def reduction_programs(draw):
    """reduce(f(x, y)) along an axis, then combined with x again (softmax-like)."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=rank, max_size=rank)))
    axis = draw(st.integers(0, rank - 1))
    dtype = draw(st.sampled_from([F32, F64, I32]))
    other = tuple(1 if i != axis and draw(st.booleans()) else s for i, s in enumerate(shape))
    reduced = tuple(1 if i == axis else s for i, s in enumerate(shape))
    red = draw(st.sampled_from(REDUCE))
    mix = draw(st.sampled_from(["mul", "sub", "max_pair"]))
    body = (I(mix, (0, 1), (), shape, dtype), I(red, (2,), (axis,), reduced, dtype),
            I("sub", (0, 3), (), shape, dtype))  # fmt: skip
    outputs = draw(st.sampled_from([(4,), (3, 4), (3,)]))
    block = ir.Block(shape, (ir.Input(shape, dtype), ir.Input(other, dtype)), body, outputs, axis)
    return block, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=20, **BLOCKS)
@given(reduction_programs())
def test_random_reduction_blocks(runtime, program):
    block, seed = program
    inputs = _values(block, seed)
    if block.inputs[0].dtype is I32:
        inputs = [np.clip(x, -5, 5) for x in inputs]  # keep int products and sums exact
    got = runtime.run(block, inputs)
    want = reference(block, inputs, wide=True)
    magnitude = math.prod(np.abs(x).max(initial=1.0) for x in inputs) ** 2
    for g, w in zip(got, want):
        if g.dtype.kind == "f":
            k = block.shape[block.axis]
            assert_close(g, w, ulps=8 * k + 8, scale=np.full(w.shape, max(magnitude, 1.0)))
        else:
            np.testing.assert_array_equal(g, w.astype(g.dtype))


# ---------------------------------------------------------------------- fused layers
def gelu_block(shape, dtype=F32):
    return ir.Block(shape, (ir.Input(shape, dtype),), (
        I("div_scalar", (0,), (math.sqrt(2.0),), shape, dtype), I("erf", (1,), (), shape, dtype),
        I("add_scalar", (2,), (1.0,), shape, dtype), I("mul", (0, 3), (), shape, dtype),
        I("mul_scalar", (4,), (0.5,), shape, dtype)), (5,))  # fmt: skip


def softmax_block(shape, axis, dtype=F32, log=False):
    r = tuple(1 if i == axis else s for i, s in enumerate(shape))
    body = [I("max_dim", (0,), (axis,), r, dtype), I("sub", (0, 1), (), shape, dtype),
            I("exp", (2,), (), shape, dtype), I("sum_dim", (3,), (axis,), r, dtype)]  # fmt: skip
    if log:
        body += [I("log", (4,), (), r, dtype), I("sub", (2, 5), (), shape, dtype)]
    else:
        body += [I("div", (3, 4), (), shape, dtype)]
    return ir.Block(shape, (ir.Input(shape, dtype),), tuple(body), (len(body),), axis)


def layer_norm_block(shape, dtype=F32):
    axis = len(shape) - 1
    r = (*shape[:-1], 1)
    w = (1,) * (len(shape) - 1) + (shape[-1],)
    body = (I("mean_dim", (0,), (axis,), r, dtype), I("sub", (0, 3), (), shape, dtype),
            I("mul", (4, 4), (), shape, dtype), I("mean_dim", (5,), (axis,), r, dtype),
            I("add_scalar", (6,), (1e-5,), r, dtype), I("rsqrt", (7,), (), r, dtype),
            I("mul", (4, 8), (), shape, dtype), I("mul", (9, 1), (), shape, dtype),
            I("add", (10, 2), (), shape, dtype))  # fmt: skip
    inputs = (ir.Input(shape, dtype), ir.Input(w, dtype), ir.Input(w, dtype))
    return ir.Block(shape, inputs, body, (11, 3), axis)


@pytest.mark.parametrize("shape, axis", [((6, 50), 1), ((50, 6), 0)])  # row and lane modes
def test_a_pass_reading_many_scalars(runtime, shape, axis):
    # 30 scalar adds before a softmax: the helpers of its passes take more arguments than
    # a call numba can inline (CPython passes them as *args).
    body = [I("add_scalar", (k,), (0.25 * k,), shape, F32) for k in range(30)]
    soft = softmax_block(shape, axis)
    n = len(body)
    for instr in soft.body:
        body.append(I(instr.op, tuple(a + n for a in instr.args), instr.attrs, instr.shape,
                      instr.dtype))  # fmt: skip
    block = ir.Block(shape, soft.inputs, tuple(body), (len(body),), axis)
    x = np.random.default_rng(12).standard_normal(shape).astype(np.float32)
    (got,) = runtime.run(block, [x])
    x64 = x.astype(np.float64) + sum(0.25 * k for k in range(30))
    e = np.exp(x64 - x64.max(axis, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis, keepdims=True), rtol=1e-5, atol=1e-7)


def test_gelu(runtime):
    x = np.random.default_rng(1).standard_normal((64, 300)).astype(np.float32) * 4
    (got,) = runtime.run(gelu_block(x.shape), [x])
    x64 = x.astype(np.float64)
    want = x64 * 0.5 * (1 + np.vectorize(math.erf)(x64 / math.sqrt(2)))
    # 1 + erf(x) cancels for x << 0 in any float32 evaluation: errors scale with |x|
    # (measured: 0.98 eps max(|gelu|, |x|) over [-12, 12] densely; 1.7 ulp for x >= 0)
    assert_close(got, want, ulps=1.5, scale=np.maximum(np.abs(want), np.abs(x64)))
    assert ulp_error(got[x >= 0], want[x >= 0]).max() <= 2


def scaled_tail_block(scale, dtype=F32, scale_last=True, outputs=None, s=(3, 700)):
    """``(x * (sqrt(y) + 1)) * scale`` (``scale_last``) or ``x * ((sqrt(y) + 1) * scale)``:
    a GELU's tail in both the orders it is written, on a factor exact to compute."""
    body = [I("sqrt", (1,), (), s, dtype), I("add_scalar", (2,), (1.0,), s, dtype)]
    if scale_last:
        body += [I("mul", (0, 3), (), s, dtype), I("mul_scalar", (4,), (scale,), s, dtype)]
    else:
        body += [I("mul_scalar", (3,), (scale,), s, dtype), I("mul", (0, 4), (), s, dtype)]
    return ir.Block(s, (ir.Input(s, dtype), ir.Input(s, dtype)), tuple(body),
                    outputs or (5,))  # fmt: skip


def test_a_power_of_two_scaling_moves_to_the_factor_ready_first():
    from ember.backends.fusion.numba_source import early_scalings

    assert early_scalings(gelu_block((4, 5))) == {5: (0, 3, 5)}  # x * 0.5 * (erf(.) + 1)
    assert early_scalings(scaled_tail_block(0.5)) == {5: (0, 3, 5)}
    assert early_scalings(scaled_tail_block(0.5, scale_last=False)) == {5: (0, 3, 4)}
    for power in (2.0, -4.0, 2**-20, 8):
        assert early_scalings(scaled_tail_block(power)) == {5: (0, 3, 5)}, power
    assert early_scalings(scaled_tail_block(0.5, F64)) == {5: (0, 3, 5)}
    assert "np.float32(np.float32(r0 * s1) * r3)" in generate(scaled_tail_block(0.5))
    for other in (0.3, 3.0, 2.0**80, 2.0**-70, math.inf, math.nan, 0.0, True):
        assert early_scalings(scaled_tail_block(other)) == {}, other
    # the unscaled product read elsewhere, or written out, stays as it is
    assert early_scalings(scaled_tail_block(0.5, outputs=(5, 4))) == {}
    assert early_scalings(scaled_tail_block(0.5, scale_last=False, outputs=(5, 4))) == {}
    # equally late factors (both inputs), and integer products, are left alone
    s = (3, 7)
    both = ir.Block(s, (ir.Input(s, F32), ir.Input(s, F32)), (
        I("mul", (0, 1), (), s, F32), I("mul_scalar", (2,), (0.5,), s, F32)), (3,))  # fmt: skip
    ints = ir.Block(s, (ir.Input(s, I32), ir.Input(s, I32)), (
        I("abs", (1,), (), s, I32), I("mul", (0, 2), (), s, I32),
        I("mul_scalar", (3,), (2,), s, I32)), (4,))  # fmt: skip
    assert early_scalings(both) == {} and early_scalings(ints) == {}


def test_the_key_tells_a_power_of_two_scaling_from_another():
    from ember.backends.fusion.ir import POWER_OF_TWO, attr_tag

    half, quarter, other = (scaled_tail_block(c).key() for c in (0.5, 0.25, 0.3))
    assert half == quarter != other
    assert attr_tag("mul_scalar", 0.5) == POWER_OF_TWO and attr_tag("mul_scalar", 0.3) == "float"
    assert attr_tag("add_scalar", 0.5) == "float" and attr_tag("mul_scalar", True) == "bool"
    for power in (1, -1, 2**60, -(2**-60), 2.0**-59, 0.5, 1.0):
        assert attr_tag("mul_scalar", power) == POWER_OF_TWO, power
    for value in (0, 0.0, -0.0, 3, 2**61, 2.0**61, 2.0**-61, 10**400, math.inf, math.nan,
                  np.float32(0.5), None, "0.5", (2,)):  # an int too large for a float too
        assert attr_tag("mul_scalar", value) == type(value).__name__, value


# A float32 erf of x / sqrt 2 (or x * (1 / sqrt 2)) is computed from x. Each case: the op and
# its scalar, the exact factor the float32 op applies (the reference's), the function called.
SCALED_ERFS = [("div_scalar", math.sqrt(2.0), 1.0 / float(np.float32(math.sqrt(2.0))),
                "fast_erf_div_sqrt2_f32"),
               ("mul_scalar", 1.0 / math.sqrt(2.0), float(np.float32(1.0 / math.sqrt(2.0))),
                "fast_erf_mul_rsqrt2_f32")]  # fmt: skip


def scaled_erf_block(op, scalar, shape, dtype=F32, outputs=(2,)):
    return ir.Block(shape, (ir.Input(shape, dtype),), (
        I(op, (0,), (scalar,), shape, dtype), I("erf", (1,), (), shape, dtype),
    ), outputs)  # fmt: skip


@pytest.mark.parametrize("op, scalar, factor, function", SCALED_ERFS)
def test_the_erf_of_x_over_sqrt2_is_computed_from_x(runtime, op, scalar, factor, function):
    x = _samples()
    assert f"{function}(r0)" in generate(scaled_erf_block(op, scalar, x.shape))
    (got,) = runtime.run(scaled_erf_block(op, scalar, x.shape), [x])
    nan = np.isnan(x)
    np.testing.assert_array_equal(np.isnan(got), nan)
    want = np.vectorize(math.erf)(x[~nan].astype(np.float64) * factor)  # exact: unrounded
    err = ulp_error(got[~nan], want)
    worst = np.argmax(err)
    assert err[worst] <= numba_math.MAX_ULP["erf"], (x[~nan][worst], err[worst])
    zeros = x == 0
    np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(x[zeros]))
    # near the pieces' seam (1.328125) and the clamp (5.5625), both signs, odd to the bit
    pos = np.concatenate([_every_float32(1.31, 1.35), _every_float32(5.5, 5.6)])
    x = np.concatenate([pos, -pos])
    (got,) = runtime.run(scaled_erf_block(op, scalar, x.shape), [x])
    assert ulp_error(got, np.vectorize(math.erf)(x.astype(np.float64) * factor)).max() <= (
        numba_math.MAX_ULP["erf"])
    np.testing.assert_array_equal(got[pos.size :], -got[: pos.size])
    np.testing.assert_array_equal(got[np.abs(x) > 5.5625], np.sign(x[np.abs(x) > 5.5625]))


def test_only_a_float32_erf_of_x_over_sqrt2_is_computed_from_x(runtime):
    from ember.backends.fusion.ir import BY_SQRT2, attr_tag

    s = (3, 50)
    for op, scalar, _, function in SCALED_ERFS:
        assert attr_tag(op, scalar) == BY_SQRT2
        assert attr_tag(op, float(np.float32(scalar))) == BY_SQRT2  # as ONNX files hold it
        assert f"{function}(r0)" in generate(scaled_erf_block(op, scalar, s))
        # float64 keeps math.erf of the quotient
        assert "math.erf(r1)" in generate(scaled_erf_block(op, scalar, s, F64))
    for op, scalar in [("div_scalar", 1.4142), ("div_scalar", 2.0), ("div_scalar", 1 / 2**0.5),
                       ("mul_scalar", math.sqrt(2.0)), ("mul_scalar", 0.7071), ("mul_scalar", 0.5),
                       ("add_scalar", math.sqrt(2.0)), ("div_scalar", 1e300),
                       ("div_scalar", math.nan), ("div_scalar", math.inf)]:  # fmt: skip
        assert attr_tag(op, scalar) != BY_SQRT2, (op, scalar)
        assert "fast_erf_f32(r1)" in generate(scaled_erf_block(op, scalar, s)), (op, scalar)
    assert attr_tag("div_scalar", 2) == "int"
    # the key tells sqrt 2 from another divisor: their kernels differ
    assert (scaled_erf_block("div_scalar", math.sqrt(2.0), s).key()
            != scaled_erf_block("div_scalar", 1.5, s).key())  # fmt: skip
    # a quotient read elsewhere is still computed, and written
    x = np.linspace(-6, 6, 150, dtype=np.float32).reshape(s)
    block = scaled_erf_block("div_scalar", math.sqrt(2.0), s, outputs=(2, 1))
    erf, quotient = runtime.run(block, [x])
    np.testing.assert_array_equal(quotient, x / np.float32(math.sqrt(2.0)))
    want = np.vectorize(math.erf)(x.astype(np.float64) / float(np.float32(math.sqrt(2.0))))
    assert ulp_error(erf, want).max() <= numba_math.MAX_ULP["erf"]


@pytest.mark.parametrize("scale", [0.5, 0.3, -4.0])
@pytest.mark.parametrize("scale_last", [True, False])
def test_a_moved_power_of_two_scaling_gives_the_same_values(runtime, scale, scale_last):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((3, 700)) * 100).astype(np.float32)
    y = rng.uniform(0, 50, (3, 700)).astype(np.float32)
    (got,) = runtime.run(scaled_tail_block(scale, scale_last=scale_last), [x, y])
    t = np.sqrt(y) + np.float32(1)  # float32 throughout, in the order the block has it
    want = (x * t) * np.float32(scale) if scale_last else x * (t * np.float32(scale))
    np.testing.assert_array_equal(got, want)  # moved only for powers of two: same values


def test_a_moved_scaling_differs_only_where_a_product_overflows(runtime):
    # x * 2 overflows float32 before the scaling by 0.5 brings it back: the op-by-op value
    # is infinite, the kernel's (which scales x first) the exact one.
    x = np.array([[3e38, -3e38, 1.5e38, 2.0]] * 3, np.float32)
    y = np.ones_like(x)
    (got,) = runtime.run(scaled_tail_block(0.5, s=x.shape), [x, y])
    np.testing.assert_array_equal(got, x)
    with np.errstate(over="ignore"):
        unfused = (x * (np.sqrt(y) + np.float32(1))) * np.float32(0.5)
    assert np.isinf(unfused[:, :2]).all() and (unfused[:, 2:] == x[:, 2:]).all()


@pytest.mark.parametrize("axis", [1, 0])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_and_log_softmax(runtime, axis, log):
    x = np.random.default_rng(2).standard_normal((37, 130)).astype(np.float32) * 5
    x[3, 4] = np.inf if not log else x[3, 4]
    x[5, 6] = np.nan
    (got,) = runtime.run(softmax_block(x.shape, axis, log=log), [x])
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        shifted = x64 - x64.max(axis, keepdims=True)
        lse = np.log(np.exp(shifted).sum(axis, keepdims=True))
        want = shifted - lse if log else np.exp(shifted - lse)
    assert_close(got, want, ulps=64, scale=np.maximum(np.abs(want), 1e-6 if not log else 1))


def test_exp_of_a_value_at_most_zero_is_fast_exp_to_the_bit():
    """``fast_exp_nonpositive_f32`` (a softmax's exp) skips the range checks that only
    positive arguments need: over every kind of float at most 0 (subnormal results, the
    clamp at -104, -inf, -0.0, NaN) it returns fast_exp_f32's bits."""
    import numba

    exp, nonpositive = numba_math.fast_exp_f32, numba_math.fast_exp_nonpositive_f32

    @numba.njit
    def both(x, a, b):
        for i in range(x.size):
            a[i] = exp(x[i])
            b[i] = nonpositive(x[i])

    deep = -_every_float32(86.0, 104.5)  # every float whose exp is below the normal range
    tiny = -_every_float32(0.0, 1e-3, step=97)  # subnormal arguments among them
    x = np.concatenate([-np.abs(_samples()), deep, tiny, np.float32([-0.0])])
    assert deep.size > 1_000_000
    a, b = np.empty_like(x), np.empty_like(x)
    both(x, a, b)
    np.testing.assert_array_equal(a.view(np.int32), b.view(np.int32))
    assert np.isnan(b).sum() == np.isnan(x).sum() > 0 and (b[x == -np.inf] == 0).all()
    assert ((b > 0) & (b < 1.1754944e-38)).any()  # subnormal results were among them


def _inlined_math_digest(roots: list[str]) -> str:
    """A digest of the numba_math functions ``roots`` and everything of numba_math they
    use, transitively (sources; numbers by their exact values)."""
    import ast
    import hashlib
    import inspect
    import textwrap
    import types

    def canonical(value) -> str:
        if isinstance(value, tuple):
            return "(" + ",".join(canonical(v) for v in value) + ")"
        if isinstance(value, (int, float, np.integer, np.floating)):
            return float(value).hex()
        return type(value).__name__

    seen, parts, todo = set(), [], list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        value = getattr(numba_math, name)
        if isinstance(value, (types.ModuleType, type)):
            continue
        fn = getattr(value, "py_func", None) or getattr(value, "_defn", None) or value
        if not inspect.isfunction(fn):
            parts.append(f"{name} = {canonical(value)}")
            continue
        if fn.__module__ != numba_math.__name__:
            continue  # numba's own (``intrinsic``)
        source = textwrap.dedent(inspect.getsource(fn))
        parts.append(source)
        todo += [n.id for n in ast.walk(ast.parse(source))
                 if isinstance(n, ast.Name) and hasattr(numba_math, n.id)]  # fmt: skip
    return hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()[:16]


@pytest.mark.parametrize("user", ["ember.nn.rnn_sequence", "ember.backends.fusion.numba_attention",
                                  "ember.backends.fusion.numba_gemm",
                                  "ember.backends.fusion.numba_conv"])  # fmt: skip
def test_cached_kernels_follow_the_math_they_inline(user):
    """numba's disk cache keys a kernel by its own file: one that inlines numba_math's
    functions would keep their old machine code after an edit of them (a NaN exp fixed in
    numba_math, still wrong in the LSTM's cached step). Each such file names the digest of
    what it imports from numba_math; an edit there must update it, renewing the cache."""
    import ast
    import importlib
    import inspect

    module = importlib.import_module(user)
    tree = ast.parse(inspect.getsource(module))
    names = sorted({a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and node.module == "ember.backends.fusion.numba_math"
                    for a in node.names})  # fmt: skip
    assert names, f"{user} imports nothing from numba_math"
    digest = _inlined_math_digest(names)
    assert digest == module.MATH_SOURCE_SHA256, (
        f"numba_math changed under {names}: set {user}.MATH_SOURCE_SHA256 to {digest} (that "
        "edit also renews numba's cache of its kernels)")  # fmt: skip


def test_only_an_exp_of_x_less_its_own_max_takes_the_shortcut():
    r, shape = (4, 1), (4, 9)

    def code(block):  # the generated functions, without the import line naming them all
        return generate(block).split("variance_sum)", 1)[1]

    soft = code(softmax_block(shape, 1))
    assert "fast_exp_nonpositive_f32(r2)" in soft and "fast_exp_f32(" not in soft
    assert "fast_exp_nonpositive_f32(r2)" in code(softmax_block(shape, 1, log=True))
    reversed_ = ir.Block(shape, (ir.Input(shape, F32),), (
        I("max_dim", (0,), (1,), r, F32), I("sub", (1, 0), (), shape, F32),
        I("exp", (2,), (), shape, F32), I("sum_dim", (3,), (1,), r, F32)), (4,), 1)  # fmt: skip
    other = ir.Block(shape, (ir.Input(shape, F32), ir.Input(shape, F32)), (
        I("max_dim", (1,), (1,), r, F32), I("sub", (0, 2), (), shape, F32),
        I("exp", (3,), (), shape, F32), I("sum_dim", (4,), (1,), r, F32)), (5,), 1)  # fmt: skip
    minimum = ir.Block(shape, (ir.Input(shape, F32),), (
        I("min_dim", (0,), (1,), r, F32), I("sub", (0, 1), (), shape, F32),
        I("exp", (2,), (), shape, F32), I("sum_dim", (3,), (1,), r, F32)), (4,), 1)  # fmt: skip
    for block in (reversed_, other, minimum):  # max - x, x - max(y), x - min(x): above 0
        source = code(block)
        assert "fast_exp_nonpositive_f32(" not in source and "fast_exp_f32(r" in source
    wide = code(softmax_block(shape, 1, dtype=F64))
    assert "math.exp(r2)" in wide and "fast_exp" not in wide


def _off_line(values: np.ndarray, offset: int) -> np.ndarray:
    """``values`` copied to memory ``offset`` bytes past a cache line's start."""
    raw = np.empty(values.nbytes + 128, np.uint8)
    start = -raw.ctypes.data % 64 + offset
    copy = raw[start : start + values.nbytes].view(values.dtype).reshape(values.shape)
    copy[...] = values
    return copy


def test_small_inputs_read_once_a_row_are_realigned():
    big, small = layer_norm_block((512, 1024)), layer_norm_block((64, 1024))
    assert nr.reread_inputs(big) == (1, 2)  # the weight and the bias, not the rows
    assert nr.reread_inputs(small) == ()  # a block this small: the copies would show
    wide = layer_norm_block((16, 32768))  # a weight of 128 KiB: read from L2 anyway
    assert nr.reread_inputs(wide) == ()
    s = (512, 1024)  # a value per row, or one for the whole block: read once, not by vectors
    column = ir.Block(s, (ir.Input(s, F32), ir.Input((512, 1), F32), ir.Input((1, 1), F32)), (
        I("mul", (0, 1), (), s, F32), I("add", (3, 2), (), s, F32)), (4,))  # fmt: skip
    assert nr.reread_inputs(column) == ()
    values = np.arange(300, dtype=np.float32).reshape(3, 100)
    for offset in (0, 4, 16, 60):
        off = _off_line(values, offset)
        assert off.ctypes.data % 64 == offset
        copy = nr.aligned_copy(off)
        assert copy.ctypes.data % 64 == 0 and copy.flags.c_contiguous
        assert copy.dtype == off.dtype and copy.shape == off.shape
        np.testing.assert_array_equal(copy, values)


def test_a_layer_norm_runs_on_realigned_weights_to_the_same_bits(runtime, monkeypatch):
    rng = np.random.default_rng(8)
    shape = (512, 1024)
    x = rng.standard_normal(shape).astype(np.float32)
    weight, bias = (rng.standard_normal((1, 1024)).astype(np.float32) for _ in range(2))
    block = layer_norm_block(shape)
    want = runtime.run(block, [x, _off_line(weight, 0), _off_line(bias, 0)])
    seen = []
    launch = nr._launch

    def spy(runtime_, kernel, arrays, *rest):
        seen.append([a.ctypes.data % 64 for a in arrays])
        return launch(runtime_, kernel, arrays, *rest)

    monkeypatch.setattr(nr, "_launch", spy)
    for offset in (16, 4, 48):
        got = runtime.run(block, [x, _off_line(weight, offset), _off_line(bias, offset + 4)])
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
    assert [s[1:] for s in seen] == [[0, 0]] * 3


def test_layer_norm_and_its_mean(runtime):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((50, 257)) * 3 + 10).astype(np.float32)
    g = rng.standard_normal((1, 257)).astype(np.float32)
    b = rng.standard_normal((1, 257)).astype(np.float32)
    y, mean = runtime.run(layer_norm_block(x.shape), [x, g, b])
    x64 = x.astype(np.float64)
    m = x64.mean(1, keepdims=True)
    want = (x64 - m) / np.sqrt(((x64 - m) ** 2).mean(1, keepdims=True) + 1e-5) * g + b
    assert mean.shape == (50, 1)
    assert_close(mean, m, ulps=64)
    assert_close(y, want, ulps=256, scale=np.maximum(np.abs(want), 1.0))


def moments_block(shape, axis, dtype=F32):
    """mean, variance (as mean and as sum of squared deviations) and the normalized x."""
    r = tuple(1 if i == axis else s for i, s in enumerate(shape))
    body = (I("mean_dim", (0,), (axis,), r, dtype), I("sub", (0, 1), (), shape, dtype),
            I("mul", (2, 2), (), shape, dtype), I("mean_dim", (3,), (axis,), r, dtype),
            I("sum_dim", (3,), (axis,), r, dtype), I("add_scalar", (4,), (1e-5,), r, dtype),
            I("rsqrt", (6,), (), r, dtype), I("mul", (2, 7), (), shape, dtype))  # fmt: skip
    return ir.Block(shape, (ir.Input(shape, dtype),), body, (1, 4, 5, 8), axis)


def test_a_one_group_elementwise_block_is_one_loop_per_part():
    """A block whose arrays all broadcast alike runs each part's slice as one loop (nested
    in a loop over chunks, LLVM reloaded an erf's constants from the constant pool on every
    vector: the GELU ran 20-30% slower), in ``span``, which the loop over claimed slices
    calls. Asked to prefetch, the slice goes in runs of PREFETCH_RUN elements, each asking
    for the lines its streamed arrays reach PREFETCH_BYTES ahead (reads for inputs, writes
    for outputs; a broadcast input is not streamed), then a tail. A bias added along the
    rows keeps its two loops either way."""
    from ember.backends.fusion import numba_source
    from ember.backends.fusion.numba_source import PREFETCH_BYTES, PREFETCH_RUN

    streams_in_one_loop = numba_source.streams_in_one_loop

    gelu = gelu_block((64, 32))
    assert streams_in_one_loop(gelu)
    plain = generate(gelu)
    assert "nchunk" not in plain and "prefetch_" not in plain.split("def span")[1]
    assert "for j in range(lo, hi):" in plain and "for i in range" not in plain
    runs = generate(gelu, prefetch=True)
    assert "nchunk" not in runs and f"for i in range({PREFETCH_RUN}):" in runs
    assert f"prefetch_read(in0, np.uintp(b_in0 + at + {PREFETCH_BYTES // 4}))" in runs
    assert f"prefetch_write(out0, np.uintp(b_out0 + at + {PREFETCH_BYTES // 4}))" in runs
    assert f"for j in range(lo + runs * {PREFETCH_RUN}, hi):" in runs
    scaled = ir.Block((100,), (ir.Input((100,), F64), ir.Input((1,), F64)),
                      (I("mul", (0, 1), (), (100,), F64),), (2,))  # fmt: skip
    source = generate(scaled, prefetch=True)
    assert "prefetch_read(in1" not in source  # the broadcast input is one value
    lines = [f"prefetch_read(in0, np.uintp(b_in0 + at + {(PREFETCH_BYTES + k * 64) // 8}))"
             for k in range(PREFETCH_RUN * 8 // 64)]  # a run of float64 spans two lines
    assert all(line in source for line in lines)
    rows = ir.Block((4, 8), (ir.Input((4, 8), F32), ir.Input((1, 8), F32)),
                    (I("add", (0, 1), (), (4, 8), F32),), (2,))  # fmt: skip
    assert not streams_in_one_loop(rows)
    assert generate(rows) == generate(rows, prefetch=True)
    assert generate(rows).count("for ") == 2
    one_value = ir.Block((1,), (ir.Input((1,), F32),), (I("neg", (0,), (), (1,), F32),), (1,))
    assert not streams_in_one_loop(one_value)  # nothing to stream: no runs to shape
    assert generate(one_value) == generate(one_value, prefetch=True)
    assert not streams_in_one_loop(layer_norm_block((8, 16)))


@pytest.mark.skipif(__import__("platform").machine() not in ("x86_64", "AMD64"),
                    reason="reads x86 machine code")  # fmt: skip
def test_the_plain_loop_of_a_cheap_body_is_vectorized(runtime):
    """Why the plain loop is the default: LLVM vectorizes it whatever the body, where it
    unrolled a run of 16 adds whole into scalar code (on a Zen 4 host, an add of two 16M
    arrays took 13-14 ms in runs against 7 in the plain loop)."""
    shape = (4096,)
    block = ir.Block(shape, (ir.Input(shape, F32), ir.Input(shape, F32)),
                     (I("add", (0, 1), (), shape, F32),), (2,))  # fmt: skip
    x = np.arange(4096, dtype=np.float32)
    np.testing.assert_array_equal(runtime.run(block, [x, x])[0], x + x)
    span = runtime.kernel(block).dispatcher.py_func.__globals__["span"]
    code = "\n".join(span.inspect_asm().values())
    packed, scalar = (len(re.findall(rf"\bv?add{kind}\b", code)) for kind in ("ps", "ss"))
    # The runs' code held 17 scalar adds there: 16 unrolled, and the tail's.
    assert packed >= 1 and scalar <= 2, (packed, scalar)


@pytest.mark.parametrize("prefetch", [False, True], ids=["plain", "runs"])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 47, 64, 100, 1000])
def test_runs_and_tails_cover_every_part_exactly(runtime, n, prefetch):
    """Each part's slice ends anywhere (in either loop shape: runs of PREFETCH_RUN, then a
    tail, when it prefetches), and a part may
    arrive unsigned, as numba's parallel launch passes it: every element is written once,
    by the op alone. In ``kernel``, numba unifies such a part with ``next_part``'s int64
    into a float64, so ``span`` is compiled for that too: its index arithmetic must stay
    int64 for every part type (a float64 index, converted back at each element, stopped
    vectorization and cost a GELU 13x at two threads)."""
    shape = (n,)
    block = ir.Block(shape, (ir.Input(shape, F32), ir.Input(shape, F32)),
                     (I("add", (0, 1), (), shape, F32), I("neg", (2,), (), shape, F32)), (3,))  # fmt: skip
    rng = np.random.default_rng(n)
    x, y = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    want = -(x + y)
    dispatcher = runtime._module(generate(block, prefetch)).kernel
    sizes = [np.int64(n)] * len(layout(block).groups)  # none where every array is one value
    for parts in (1, 2, 3, 5):
        for unsigned in (False, True):
            out = np.full(n, np.nan, np.float32)
            err = np.zeros(2, np.int64)
            err[1] = parts  # one call a part: none left to claim
            for part in range(parts):
                dispatcher(x, y, out, *sizes, np.int64(n), err,
                           np.uint64(part) if unsigned else np.int64(part), np.int64(parts))
            np.testing.assert_array_equal(out, want)
    span = dispatcher.py_func.__globals__["span"]
    parts_types = {str(signature[-2]) for signature in span.signatures}
    assert parts_types >= {"int64", "uint64", "float64"}
    for signature in span.signatures:
        types = span.overloads[signature].type_annotation.typemap
        indexes = {name: str(t) for name, t in types.items()
                   if name.split(".")[0] in ("lo", "hi", "at", "j")}  # fmt: skip
        assert set(indexes.values()) <= {"int64"}, (signature, indexes)


@pytest.mark.parametrize("axis", [0, 1])
def test_an_output_summed_in_the_block_is_written_once(runtime, axis):
    """A gradient and its sum along an axis (a bias's gradient beside its input's): the
    last pass writes the gradient, and no final loop walks the axis to write it again."""
    shape = (12, 40)
    r = tuple(1 if d == axis else n for d, n in enumerate(shape))
    block = ir.Block(shape, (ir.Input(shape, F32), ir.Input(shape, F32)), (
        I("mul", (0, 1), (), shape, F32), I("sum_dim", (2,), (axis,), r, F32)), (2, 3),
        axis=axis)  # fmt: skip
    source = generate(block)
    assert source.count("for k in range") == 1 and source.count("out0[") == 1
    rng = np.random.default_rng(11)
    a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    product, total = runtime.run(block, [a, b])
    np.testing.assert_array_equal(product, a * b)
    np.testing.assert_allclose(total, (a.astype(np.float64) * b).sum(axis, keepdims=True),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_mean_and_variance_take_one_pass():
    # pass 1: mean and variance (shifted sums); then the normalized output: two walks.
    # Along a row of at most FLOAT32_MOMENTS_MAX, the sums are float32 ones shifted by the
    # mean of the first values (a short walk), walked again in float64 only where they do
    # not hold; longer rows walk once in float64.
    from ember.backends.fusion.numba_source import FLOAT32_MOMENTS_MAX

    for source in (generate(layer_norm_block((8, 16))), generate(moments_block((8, 16), 1))):
        rows = source.split("def span")[1]
        assert f"if n1 <= {FLOAT32_MOMENTS_MAX}:" in rows and rows.count("for k in range(mhead):") == 1
        # the float32 walk, its float64 fallback, the long rows' walk, the final walk
        assert rows.count("for k in range(n1):") == 4
    # along a non-last axis the loops along it walk a chunk of the last dim innermost
    lanes = generate(moments_block((4, 8, 16), 1))
    assert lanes.count("for k in range") == 2
    assert lanes.count("for jj in range(width)") >= 3


@pytest.mark.parametrize("shape, axis", [((40, 1000), 1), ((3, 300, 263), 1), ((12, 5000), 1),
                                         ((40, 9), 1)])  # fmt: skip
def test_variance_of_large_mean_data_matches_float64(runtime, shape, axis):
    # 1e4 + N(0, 1) in float32: a sum of squares in float32 (1e8, ulp 8) loses the
    # variance entirely; shifted sums keep it to the float32 rounding. Rows: float32 sums
    # shifted by the mean of the first 16 values (1000, 9: fewer values than that), and
    # where they would not hold the float64 walk; 5000 (and lane mode, 263) float64 only.
    rng = np.random.default_rng(8)
    n = shape[axis]
    rows = (1e4 + rng.standard_normal((math.prod(shape) // n, n))).astype(np.float32)
    rows[0] = 1e4 + 0.5  # constant: variance exactly 0
    rows[1, 0] = 1e4 + 3000  # an outlier as the shift
    rows[2, 5] = np.nan
    rows[3, 7 % n] = np.inf
    rows[4, 0] = -np.inf  # a non-finite shift falls back to 0
    rows[4, 9 % n] = np.inf
    rows[5, 0] = np.inf
    rows[6] = rng.standard_normal(n) * 1e-22  # squares below float32's normal range
    rows[7] = rng.standard_normal(n) * 1e19  # squares beyond float32's range
    rows[8, : n // 2] = -5e3  # the first values' mean far from the row's
    rows[9, : min(16, n // 2)] = 1e4 + 100  # and far beside the row's spread: float32 sums
    # shifted there would cancel (the float64 walk takes over)
    moved = [s for i, s in enumerate(shape) if i != axis] + [n]
    x = np.ascontiguousarray(np.moveaxis(rows.reshape(moved), -1, axis))
    mean, var, ss, y = runtime.run(moments_block(shape, axis), [x])
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        m = x64.mean(axis, keepdims=True)
        d = x64 - m
        v = (d * d).mean(axis, keepdims=True)
        want_y = d / np.sqrt(v + 1e-5)
    assert_close(mean, m, ulps=2)
    assert_close(var, v, ulps=4)
    assert_close(ss, v * shape[axis], ulps=4)
    assert np.all(var[np.isfinite(v)] >= 0)
    assert np.moveaxis(var, axis, -1).reshape(-1)[0] == 0
    # x - mean in float32 carries the rounding of a mean near 1e4
    with np.errstate(invalid="ignore"):
        scale = np.maximum(np.abs(x64) / np.sqrt(v + 1e-5), 1.0)
    assert_close(y, want_y, ulps=8, scale=np.where(np.isfinite(scale), scale, 1.0))


def test_sum_over_a_leading_axis_with_broadcast_operand(runtime):
    # lane mode: the chunked last dim (300 = 256 + 44), an outer dim, a broadcast operand
    shape, other = (2, 70, 300), (1, 70, 1)
    block = ir.Block(shape, (ir.Input(shape, F64), ir.Input(other, F64)), (
        I("mul", (0, 1), (), shape, F64), I("sum_dim", (2,), (1,), (2, 1, 300), F64),
        I("max_dim", (0,), (1,), (2, 1, 300), F64), I("sub", (0, 4), (), shape, F64)),
        (3, 4, 5), axis=1)  # fmt: skip
    rng = np.random.default_rng(9)
    x, y = rng.standard_normal(shape), rng.standard_normal(other)
    x[1, 3, 299] = np.nan
    s, mx, d = runtime.run(block, [x, y])
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(s, (x * y).sum(1, keepdims=True), rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(mx, x.max(1, keepdims=True))
        np.testing.assert_array_equal(d, x - x.max(1, keepdims=True))


def test_f64_kernels_use_exact_math(runtime):
    x = np.random.default_rng(4).standard_normal((3, 1000)) * 3
    (got,) = runtime.run(gelu_block(x.shape, F64), [x])
    want = x * 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    assert_close(got, want, ulps=8, scale=np.maximum(np.abs(want), np.abs(x)))


# ---------------------------------------------------------------------- semantics at the edges
def test_integer_division_edges_match_ndarray(runtime):
    shape = (9, 9)
    v = np.array([0, 1, -1, 7, -7, 2, -2, np.iinfo(np.int64).min, np.iinfo(np.int64).max])
    a, b = np.broadcast_arrays(v[:, None], v[None, :])
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    block = ir.Block(shape, (ir.Input(shape, I64), ir.Input(shape, I64)), (
        I("div", (0, 1), (), shape, I64), I("remainder", (0, 1), (), shape, I64),
        I("bitwise_left_shift", (0, 1), (), shape, I64),
        I("bitwise_right_shift", (0, 1), (), shape, I64)), (2, 3, 4, 5))  # fmt: skip
    got = runtime.run(block, [a, b])
    for g, w in zip(got, reference(block, [a, b], wide=False)):
        np.testing.assert_array_equal(g, w)


def test_float_remainder_nan_and_signed_zero(runtime):
    v = np.array([0.0, -0.0, 5.0, -5.0, 2.5, np.inf, -np.inf, np.nan], np.float32)
    shape = (8, 8)
    a, b = (np.ascontiguousarray(x) for x in np.broadcast_arrays(v[:, None], v[None, :]))
    block = ir.Block(shape, (ir.Input(shape, F32), ir.Input(shape, F32)), (
        I("remainder", (0, 1), (), shape, F32), I("div", (0, 1), (), shape, F32),
        I("max_pair", (0, 1), (), shape, F32), I("recip", (0,), (), shape, F32),
        I("round", (0,), (), shape, F32)), (2, 3, 4, 5, 6))  # fmt: skip
    got = runtime.run(block, [a, b])
    for g, w in zip(got, reference(block, [a, b], wide=False)):
        np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(np.signbit(g), np.signbit(w))


def test_negative_int_power_is_refused(runtime):
    shape = (4,)
    block = ir.Block(shape, (ir.Input(shape, I32), ir.Input(shape, I32)),
                     (I("pow", (0, 1), (), shape, I32),), (2,))  # fmt: skip
    ok = runtime.run(block, [np.array([2, 3, -2, 0], np.int32), np.array([3, 0, 5, 2], np.int32)])
    np.testing.assert_array_equal(ok[0], [8, 1, -32, 0])
    with pytest.raises(KernelUnsupported, match="negative power"):
        runtime.run(block, [np.array([2, 3, 4, 5], np.int32), np.array([1, -1, 1, 1], np.int32)])


def test_scalar_out_of_range_is_refused(runtime):
    block = ir.Block((3,), (ir.Input((3,), I8),), (I("add_scalar", (0,), (300,), (3,), I8),), (1,))
    with pytest.raises(UnsupportedError, match="300"):
        runtime.run(block, [np.zeros(3, np.int8)])


@pytest.mark.parametrize("dtype", [DType.F16, DType.BF16])
def test_half_precision_falls_back(runtime, dtype):
    block = ir.Block((4,), (ir.Input((4,), dtype),), (I("exp", (0,), (), (4,), dtype),), (1,))
    with pytest.raises(UnsupportedError, match=dtype.value):
        runtime.kernel(block)


# ---------------------------------------------------------------------- memory and layout
def test_non_contiguous_inputs_and_given_outputs(runtime):
    base = np.random.default_rng(5).standard_normal((300, 64)).astype(np.float32)
    x = base.T  # a transposed view, as torch's .t() hands over
    out = np.empty((64, 300), np.float32)
    (got,) = runtime.run(gelu_block(x.shape), [x], out=[out])
    assert got is out
    (again,) = runtime.run(gelu_block(x.shape), [np.ascontiguousarray(x)])
    np.testing.assert_array_equal(out, again)
    with pytest.raises(ValueError, match="C-contiguous"):
        runtime.run(gelu_block(x.shape), [x], out=[np.empty((300, 64), np.float32).T])
    with pytest.raises(ValueError, match="input 0"):
        runtime.run(gelu_block(x.shape), [base])


def test_broadcast_views_are_read_in_place(runtime):
    # An expand (stride 0 along a dim) reaches a block as a view; the kernel reads the one
    # copy it repeats, as it reads a bias, instead of the runtime writing out every repeat
    rng = np.random.default_rng(8)
    shape, r = (64, 48), (64, 1)
    x = rng.standard_normal(shape).astype(np.float32)
    column = np.broadcast_to(rng.standard_normal(r).astype(np.float32), shape)
    scalar = np.broadcast_to(np.float32(3.0), shape)
    product = ir.Block(shape, (ir.Input(shape, F32), ir.Input(shape, F32)), (
        I("mul", (0, 1), (), shape, F32), I("sum_dim", (2,), (1,), r, F32)), (3,), axis=1)  # fmt: skip
    add = ir.Block(shape, (ir.Input(shape, F32), ir.Input(shape, F32)),
                   (I("add", (0, 1), (), shape, F32),), (2,))  # fmt: skip
    def takes(inputs_of_each):  # pool buffers taken by the runs (outputs, input copies)
        before = runtime.pool.hits + runtime.pool.misses
        outs = [runtime.run(block, inputs)[0] for block, inputs in inputs_of_each]
        return runtime.pool.hits + runtime.pool.misses - before, outs

    copied = [np.ascontiguousarray(column), np.ascontiguousarray(scalar)]
    plain, (summed_copy, _) = takes([(product, [x, copied[0]]), (add, [copied[1], x])])
    viewed, (summed, added) = takes([(product, [x, column]), (add, [scalar, x])])
    assert viewed == plain  # the outputs' buffers only: no copy of the views
    np.testing.assert_array_equal(summed, summed_copy)
    np.testing.assert_allclose(summed, (x.astype(np.float64) * column).sum(1, keepdims=True),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    np.testing.assert_array_equal(added, x + np.float32(3.0))
    # Reduced along the repeated dim: each row sums its one value 48 times
    alone = ir.Block(shape, (ir.Input(shape, F32),), (I("sum_dim", (0,), (1,), r, F32),), (1,),
                     axis=1)  # fmt: skip
    (total,) = runtime.run(alone, [column])
    np.testing.assert_allclose(total, column[:, :1] * 48, rtol=1e-6)


def test_a_block_with_a_broadcast_view_works_its_launch_out_once(runtime, monkeypatch):
    # The block the kernel reads the view through is kept with the block it came from: a
    # second run finds its launch, without looking the kernel up again; another expanded
    # input is another block, and the results are the same as for the copies.
    rng = np.random.default_rng(9)
    shape = (64, 48)
    x = rng.standard_normal(shape).astype(np.float32)
    row = rng.standard_normal((1, 48)).astype(np.float32)
    column = rng.standard_normal((64, 1)).astype(np.float32)
    add = ir.Block(shape, (ir.Input(shape, F32), ir.Input(shape, F32)),
                   (I("add", (0, 1), (), shape, F32),), (2,))  # fmt: skip
    lookups = []
    kernel = runtime.kernel
    monkeypatch.setattr(runtime, "kernel", lambda block: (lookups.append(block), kernel(block))[1])
    for operand, lookups_after in ((row, 1), (row, 1), (column, 2), (column, 2), (row, 2)):
        (got,) = runtime.run(add, [x, np.broadcast_to(operand, shape)])
        np.testing.assert_array_equal(got, x + operand)
        assert len(lookups) == lookups_after


def test_a_plain_launch_is_worked_out_once_and_other_inputs_take_the_general_path(
        runtime, monkeypatch):  # fmt: skip
    # Inputs exactly the block's (shapes, dtypes, C-contiguous) launch as worked out on the
    # second run; any other input runs the general path, with its copies, views and errors.
    shape = (512, 256)
    block = gelu_block(shape)
    x = np.random.default_rng(11).standard_normal(shape).astype(np.float32)
    (want,) = runtime.run(block, [x], out=[np.empty(shape, np.float32)])  # the general path
    runtime.run(block, [x])
    assert (None, runtime.threads) in block.__dict__["_numba_plain"][1]
    general = []
    broadcast_views = nr._broadcast_views
    monkeypatch.setattr(nr, "_broadcast_views",
                        lambda *a: (general.append(a), broadcast_views(*a))[1])  # fmt: skip
    launches = runtime.stats.launches
    (got,) = runtime.run(block, [x])
    assert general == [] and runtime.stats.launches == launches + 1
    np.testing.assert_array_equal(got, want)
    for other in (np.asfortranarray(x), np.broadcast_to(x[:1], shape)):
        (got,) = runtime.run(block, [other])
        np.testing.assert_array_equal(got, runtime.run(block, [np.ascontiguousarray(other)])[0])
    assert len(general) == 2  # the two views; their copies launch plainly
    with pytest.raises(ValueError, match="input 0 must be f32"):
        runtime.run(block, [x.astype(np.float64)])
    with pytest.raises(ValueError, match="input 0 must be f32"):
        runtime.run(block, [x[:, :128].copy()])
    power = ir.Block((4,), (ir.Input((4,), I32), ir.Input((4,), I32)),
                     (I("pow", (0, 1), (), (4,), I32),), (2,))  # fmt: skip
    ints = [np.array([2, 3, 4, 5], np.int32), np.array([1, 2, 1, 1], np.int32)]
    for _ in range(2):
        np.testing.assert_array_equal(runtime.run(power, ints)[0], [2, 9, 4, 5])
    assert (None, runtime.threads) in power.__dict__["_numba_plain"][1]
    with pytest.raises(KernelUnsupported, match="negative power"):
        runtime.run(power, [ints[0], np.array([1, -1, 1, 1], np.int32)])


def test_a_kept_launch_follows_the_runtimes_thread_count(runtime, monkeypatch):
    # A run that asks no thread count takes the runtime's; a launch kept from a run at one
    # count is not reused at another (a benchmark at one thread, then at two, ran its
    # untuned blocks on one thread in the second row).
    shape = (1024, 512)  # over PARALLEL_MIN: the runtime's thread count applies
    block = gelu_block(shape)
    x = np.random.default_rng(12).standard_normal(shape).astype(np.float32)
    launched = []  # each launch's kernel calls: one a thread
    run_parts = nr._run_parts

    def counted(kernel, args, parts, threads=None, calls=None):
        launched.append(calls)
        run_parts(kernel, args, parts, threads, calls=calls)

    monkeypatch.setattr(nr, "_run_parts", counted)
    monkeypatch.setattr(runtime, "threads", 1)
    want = runtime.run(block, [x])[0].copy()
    for threads in (1, 2, 1):
        monkeypatch.setattr(runtime, "threads", threads)
        launched.clear()
        for _ in range(2):
            np.testing.assert_array_equal(runtime.run(block, [x])[0], want)
        assert launched == [threads, threads]


def test_output_over_its_own_input(runtime):
    # x * softmax(x): the kernel parks exp(x - max) in its output between the last pass
    # and the final loop, which reads x again; an output that is x itself must not
    # clobber it
    shape, r = (9, 40), (9, 1)
    block = ir.Block(shape, (ir.Input(shape, F32),), (
        I("max_dim", (0,), (1,), r, F32), I("sub", (0, 1), (), shape, F32),
        I("exp", (2,), (), shape, F32), I("sum_dim", (3,), (1,), r, F32),
        I("div", (3, 4), (), shape, F32), I("mul", (0, 5), (), shape, F32)), (6,), axis=1)  # fmt: skip
    assert "out0[" in generate(block).split("for k in range")[2]  # the last pass stores
    x = np.random.default_rng(10).standard_normal(shape).astype(np.float32)
    (want,) = runtime.run(block, [x])
    want = want.copy()
    (got,) = runtime.run(block, [x], out=[x])
    assert got is x
    np.testing.assert_array_equal(got, want)
    x64 = np.random.default_rng(10).standard_normal(shape).astype(np.float32).astype(np.float64)
    e = np.exp(x64 - x64.max(1, keepdims=True))
    assert_close(want, x64 * e / e.sum(1, keepdims=True), ulps=64, scale=np.abs(x64) + 1e-3)


def test_pool_reuses_released_outputs(runtime):
    x = np.ones((512, 512), np.float32)
    (first,) = runtime.run(gelu_block(x.shape), [x])
    address = first.__array_interface__["data"][0]
    assert runtime.release(first)
    assert not runtime.release(first)  # once only
    (second,) = runtime.run(gelu_block(x.shape), [x])
    assert second.__array_interface__["data"][0] == address
    assert not runtime.release(np.ones((512, 512), np.float32))  # not the pool's


def test_large_pooled_buffers_start_on_a_page(runtime):
    # Rows of 4 KiB then each lie on one page (the prefetcher stops at page ends)
    from ember.backends.fusion.buffers import BufferPool

    pool = BufferPool()
    for shape in [(4096, 1024), (17, 1000), (1 << 14,)]:
        array = pool.take(shape, np.float32)
        assert array.__array_interface__["data"][0] % 4096 == 0 and array.shape == shape
        array[...] = 1.0  # the whole array lies in its buffer
        assert pool.release(array)
        again = pool.take(shape, np.float32)  # the same buffer, still from the page
        assert again.__array_interface__["data"][0] == array.__array_interface__["data"][0]


def _anon_huge_kib(address: int) -> int | None:
    """The kiB of transparent huge pages backing the mapping that holds ``address``
    (``/proc/self/smaps``); None where the file is not there."""
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return None
    inside = False
    for line in text.splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(part, 16) for part in head.split("-"))
            inside = low <= address < high
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    return None


def test_buffers_of_4_mib_and_more_start_on_2_mib_and_ask_for_huge_pages(monkeypatch):
    from ember.backends.fusion import buffers
    from ember.backends.fusion.buffers import BufferPool

    pool = BufferPool()
    big = pool.take((1024, 1025), np.float32)  # just over 4 MiB
    address = big.__array_interface__["data"][0]
    assert address % (1 << 21) == 0 and big.flags.c_contiguous and big.flags.writeable
    big[...] = 2.0
    assert pool.release(big)
    again = pool.take((1024, 1025), np.float32)
    assert again.__array_interface__["data"][0] == address and (again == 2.0).all()
    view = again[3:]
    del again  # a view keeps the mapping: the pool must not take it back or unmap it
    pool.take((1024, 1025), np.float32)[...] = 5.0  # a new buffer, not the viewed one
    assert (view == 2.0).all()
    enabled = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    mode = enabled.read_text() if enabled.exists() else ""
    if "[madvise]" in mode or "[always]" in mode:
        huge = _anon_huge_kib(address)
        if huge is None:
            pytest.skip("no /proc/self/smaps to read the huge pages from")
        # The first 2 MiB page at least (the kernel may be short of free huge pages for more)
        assert huge >= 2048, huge
    # Turned off, and below 4 MiB: NumPy's memory, from a page
    monkeypatch.setenv("EMBER_FUSION_HUGE_PAGES", "0")
    plain = BufferPool().take((1024, 1025), np.float32)
    assert plain.base.base is None or not isinstance(plain.base.base, buffers.mmap.mmap)
    small = pool.take((1000, 1000), np.float32)
    assert not isinstance(small.base.base, buffers.mmap.mmap)
    assert small.__array_interface__["data"][0] % 4096 == 0


def test_thread_counts_agree(runtime):
    x = np.random.default_rng(6).standard_normal((64, 1000)).astype(np.float32)
    one = runtime.run(softmax_block(x.shape, 1), [x], threads=1)[0].copy()
    two = runtime.run(softmax_block(x.shape, 1), [x], threads=2)[0]
    np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("threads", [None, 2])
@pytest.mark.parametrize("shape", [(1, 8), (3, 5), (128, 1024), (5, 40000)])
def test_every_part_of_a_run_computes_its_tasks(runtime, threads, shape):
    # (1, 8): one task for two parts; (5, 40000): element-wise tasks split rows in chunks.
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    (y,) = runtime.run(softmax_block(x.shape, 1), [x], threads=threads)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    (g,) = runtime.run(gelu_block(x.shape), [x], threads=threads)
    one = runtime.run(gelu_block(x.shape), [x], threads=1)[0]
    np.testing.assert_array_equal(g, one)


def test_kernel_calls_claim_the_slices_after_their_own_once(runtime):
    """A call of a kernel runs its own slice, then claims the next from ``err[1]`` until
    none is left, so each slice runs once whichever call takes it: a kernel that adds 1 in
    place would leave a 2 where a slice ran twice, and a 0 where none ran it."""
    shape = (4099,)  # slices of unequal length
    block = ir.Block(shape, (ir.Input(shape, F32),),
                     (I("add_scalar", (0,), (1.0,), shape, F32),), (1,))  # fmt: skip
    x = np.zeros(shape, np.float32)
    runtime.run(block, [x], [x])  # compiles; in place
    np.testing.assert_array_equal(x, 1)
    kernel = runtime.kernel(block).dispatcher
    err = np.array([0, 1])  # one call, slice 0 its own: it claims slices 1 to 6
    kernel(x, x, np.float32(1), shape[0], 16384, err, 0, 7)
    np.testing.assert_array_equal(x, 2)
    assert err.tolist() == [0, 8]  # six claims taken, the seventh found nothing
    err = np.array([0, 3])  # three calls, slices 0-2 their own: the first to run takes 3-6
    for part in (2, 0, 1):
        kernel(x, x, np.float32(1), shape[0], 16384, err, part, 7)
    np.testing.assert_array_equal(x, 3)
    assert err.tolist() == [0, 10]
    runtime.run(block, [x], [x], threads=2)  # a call a thread, on the workers
    np.testing.assert_array_equal(x, 4)


def test_runs_on_the_runtimes_workers_leave_numbas_threads_alone(runtime, monkeypatch):
    from ember.backends.fusion import numba_parallel

    monkeypatch.setenv("EMBER_FUSION_WORKERS", "ember")
    monkeypatch.setitem(numba_parallel._state, "enabled", None)
    launched = []
    monkeypatch.setattr(numba_parallel, "run", lambda *a: launched.append(a) or True)
    x = np.ones((512, 512), np.float32)
    (y,) = runtime.run(gelu_block(x.shape), [x], threads=2)
    np.testing.assert_array_equal(y, runtime.run(gelu_block(x.shape), [x], threads=1)[0])
    assert not numba_parallel.enabled() and not launched


def _recording_kernel(log, slow_part=None, failing_part=None, wait_for_worker=False):
    """A stand-in kernel: records (tag, part, parts, thread name); one part may sleep, or
    wait until a worker thread ran a part, and one may raise."""
    worker_ran = threading.Event()

    def kernel(tag, part, parts):
        if part == slow_part:
            if wait_for_worker:
                assert worker_ran.wait(10), "no worker thread took a part"
            else:
                time.sleep(0.02)
        log.append((tag, part, parts, threading.current_thread().name))
        if threading.current_thread() is not threading.main_thread():
            worker_ran.set()
        if part == failing_part:
            raise ZeroDivisionError(f"part {part}")

    return kernel


@pytest.mark.parametrize("slow_part", [None, 0, 3])
def test_run_parts_runs_every_part_once_part_0_on_the_caller(slow_part):
    log = []
    nr._run_parts(_recording_kernel(log, slow_part), ["a"], 7)
    assert sorted(p for _, p, _, _ in log) == list(range(7))
    assert {(t, n) for t, _, n, _ in log} == {("a", 7)}
    assert [name for _, p, _, name in log if p == 0] == [threading.current_thread().name]


@pytest.mark.skipif(nr._MAX_THREADS < 2, reason="one core: no worker threads")
def test_run_parts_workers_take_parts_while_the_caller_is_busy():
    log = []
    nr._run_parts(_recording_kernel(log, slow_part=0, wait_for_worker=True), ["w"], 4)
    assert sorted(p for _, p, _, _ in log) == [0, 1, 2, 3]
    assert any(name.startswith("ember-fusion") for _, _, _, name in log)


@pytest.mark.parametrize("eventfd", [True, False])
def test_workers_over_eventfds_and_over_pipes(monkeypatch, eventfd):
    if not eventfd:
        monkeypatch.delattr(os, "eventfd", raising=False)
    elif not hasattr(os, "eventfd"):
        pytest.skip("no eventfd here")
    workers = nr._Workers(2)
    for parts in (2, 3, 9):
        log = []
        workers.run(_recording_kernel(log, slow_part=0, wait_for_worker=True), ["p"], parts)
        assert sorted(p for _, p, _, _ in log) == list(range(parts))
        assert any(name.startswith("ember-fusion") for _, _, _, name in log)


@pytest.mark.skipif(nr._MAX_THREADS < 2, reason="one core: no worker threads")
def test_sleeping_workers_hold_no_reference_to_a_launchs_arrays():
    """A kernel's output goes back to the buffer pool when nothing refers to it: a worker
    that kept its last job would keep every output of a kernel in parts from the pool."""
    import gc
    import weakref

    output = np.empty(4)
    gone = weakref.ref(output)
    log = []
    nr._run_parts(_recording_kernel(log, slow_part=0, wait_for_worker=True), [output], 4)
    assert any(name.startswith("ember-fusion") for _, _, _, name in log)
    del output, log
    deadline = time.monotonic() + 5  # the worker may still be between its part and sleep
    while gone() is not None and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert gone() is None


def test_run_parts_raises_a_workers_error_after_all_parts_end():
    log = []
    with pytest.raises(ZeroDivisionError, match="part 2"):
        nr._run_parts(_recording_kernel(log, slow_part=0, failing_part=2), ["b"], 4)
    assert sorted(p for _, p, _, _ in log) == [0, 1, 2, 3]
    log.clear()  # the workers are left in order for the next launch
    nr._run_parts(_recording_kernel(log), ["c"], 3)
    assert sorted(p for _, p, _, _ in log) == [0, 1, 2]


def test_run_parts_from_several_threads_at_once():
    from concurrent.futures import ThreadPoolExecutor

    log = []

    def launch(tag):
        nr._run_parts(_recording_kernel(log, slow_part=1), [tag], 5)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(launch, range(8)))
    assert sorted((t, p) for t, p, _, _ in log) == [(t, p) for t in range(8) for p in range(5)]


def test_a_spinning_wait_sees_another_threads_store_and_times_out_without_one(monkeypatch):
    from ember.backends.fusion import numba_spin

    counter = np.zeros(1, np.int64)
    address = counter.ctypes.data
    assert not numba_spin.wait_for_change(address, 0, 1000)  # nothing changed
    rounds = numba_spin.rounds_for(0.5, address, 0)  # about half a second of checks
    assert rounds > 0
    timer = threading.Timer(0.01, lambda: counter.__setitem__(0, 7))
    timer.start()
    started = time.monotonic()
    assert numba_spin.wait_for_change(address, 0, rounds)  # the store ends the wait early
    assert time.monotonic() - started < 0.45
    timer.join()
    assert numba_spin.wait_for_change(address, 0, 1) and not numba_spin.wait_for_change(address, 7, 1)
    monkeypatch.setenv("EMBER_FUSION_SPIN_US", "0")
    assert numba_spin.spin_seconds() == 0 and numba_spin.rounds_for(0.0, address, 7) == 0
    monkeypatch.setenv("EMBER_FUSION_SPIN_US", "250")
    assert numba_spin.spin_seconds() == pytest.approx(250e-6)


def test_launches_after_idle_gaps_run_every_part_once():
    # Workers asleep (long gaps), spinning (short gaps) or just done all wake for a launch
    # (the caller's part 0 waits until a worker ran a part) and run each part once.
    log = []
    for gap in (0.0, 0.0001, 0.002, 0.0, 0.02):
        time.sleep(gap)
        log.clear()
        nr._run_parts(_recording_kernel(log, slow_part=0, wait_for_worker=True), [None], 3)
        assert sorted(part for _, part, _, _ in log) == [0, 1, 2]
        assert any(name.startswith("ember-fusion") for _, _, _, name in log)


def test_sizes_are_not_part_of_the_key(runtime):
    before = runtime.stats.compiled + runtime.stats.disk_hits
    for n in (1, 5, 1000):
        x = np.full((n, 3), 0.5, np.float32)
        runtime.run(gelu_block(x.shape), [x])
    # one kernel for the (rank 2, no broadcast) GELU whatever the sizes (already compiled
    # by an earlier test, or compiled here once)
    assert runtime.stats.compiled + runtime.stats.disk_hits - before <= 1
    assert (
        np.empty((0, 3), np.float32).size
        == runtime.run(gelu_block((0, 3)), [np.empty((0, 3), np.float32)])[0].size
    )


def test_blocks_of_one_source_share_one_kernel(kernel_cache):
    # Ranks and unit dims are part of a block's key, but a [6] chain, a [2, 1, 3] one (unit
    # dim dropped, the rest merged into one loop) and a rank-0 one generate the same
    # source: one compile, the other two find it in memory.
    runtime = nr.NumbaRuntime(cache=kernel_cache / "shared")
    for shape in [(6,), (2, 1, 3), (1, 6, 1)]:
        x = np.linspace(-3, 3, math.prod(shape), dtype=np.float32).reshape(shape)
        (y,) = runtime.run(gelu_block(shape), [x])
        np.testing.assert_allclose(y, NdArray().gelu(x), rtol=2e-6, atol=1e-7)
    assert (runtime.stats.compiled + runtime.stats.disk_hits, runtime.stats.memory_hits) == (1, 2)
    assert len({k.source_path for k in runtime._kernels.values()}) == 1
    # a block that broadcasts one input is another kernel
    y = np.ones((2, 1), np.float32)
    block = ir.Block((2, 3), (ir.Input((2, 3), F32), ir.Input((2, 1), F32)),
                     (I("add", (0, 1), (), (2, 3), F32),), (2,))
    runtime.run(block, [np.ones((2, 3), np.float32), y])
    assert runtime.stats.compiled + runtime.stats.disk_hits == 2


def test_a_block_run_again_keeps_its_launch_and_each_runtime_its_own(runtime, kernel_cache,
                                                                      monkeypatch):  # fmt: skip
    looked_up = []
    kernel = nr.NumbaRuntime.kernel
    monkeypatch.setattr(nr.NumbaRuntime, "kernel",
                        lambda self, block: (looked_up.append(self), kernel(self, block))[1])  # fmt: skip
    block = gelu_block((5, 7))
    other = nr.NumbaRuntime(cache=kernel_cache)
    for i, rt in enumerate([runtime] * 3 + [other] * 2 + [runtime]):
        x = np.linspace(-3 + i / 4, 3 - i / 2, 35, dtype=np.float32).reshape(5, 7)
        (y,) = rt.run(block, [x])
        np.testing.assert_allclose(y, NdArray().gelu(x), rtol=2e-6, atol=1e-7)
    # Looked up on a runtime's first run of the block, and again after another's.
    assert looked_up == [runtime, other, runtime]
    # A scalar that does not fit its dtype is refused on every run, not only the first.
    wide = ir.Block((3,), (ir.Input((3,), DType.I8),), (I("add_scalar", (0,), (300,), (3,), DType.I8),), (1,))
    for _ in range(2):
        with pytest.raises(KernelUnsupported, match="does not fit"):
            runtime.run(wide, [np.ones(3, np.int8)])


# ---------------------------------------------------------------------- caching
_CHILD = """
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_numba_runtime import softmax_block
from ember.backends.fusion.numba_runtime import NumbaRuntime
rt = NumbaRuntime(cache={cache!r})
x = np.arange(12, dtype=np.float32).reshape(3, 4)
(y,) = rt.run(softmax_block(x.shape, 1), [x])
print(json.dumps({{"compiled": rt.stats.compiled, "disk_hits": rt.stats.disk_hits,
                  "sum": float(y.sum())}}))
"""


def test_second_run_and_new_process_compile_nothing(runtime, kernel_cache):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    runtime.run(softmax_block(x.shape, 1), [x])
    compiled, hits = runtime.stats.compiled, runtime.stats.memory_hits
    runtime.run(softmax_block(x.shape, 1), [x])
    assert runtime.stats.compiled == compiled
    assert runtime.stats.memory_hits == hits + 1
    code = _CHILD.format(tests=os.path.dirname(__file__), cache=str(kernel_cache))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert child == {"compiled": 0, "disk_hits": 1, "sum": pytest.approx(3.0)}


# ---------------------------------------------------------------------- without numba
def test_without_numba_the_runtime_names_the_extra(monkeypatch):
    monkeypatch.setattr(nr, "numba", None)
    assert not nr.available()
    with pytest.raises(BackendUnavailableError, match=r"ember\[jit\]"):
        nr.NumbaRuntime()


def test_a_large_run_is_split_into_parts_threads_claim():
    """One part per thread up to 2 * PART_ELEMENTS elements a thread, then more, up to
    PARTS_PER_THREAD each; one thread runs one part."""
    size = nr.PART_ELEMENTS
    assert nr._parts(1, 1 << 30) == 1
    assert nr._parts(2, 2 * size) == 2
    assert nr._parts(2, 2 * size * 3) == 6
    assert nr._parts(2, 1 << 40) == 2 * nr.PARTS_PER_THREAD
    assert nr._parts(4, 1) == 4


def test_a_run_split_finer_than_its_threads_equals_one_part(runtime, monkeypatch):
    block = gelu_block((8, 4096))
    x = np.random.default_rng(3).normal(size=(8, 4096)).astype(np.float32)
    whole = runtime.run(block, [x], None, 1)[0].copy()
    monkeypatch.setattr(nr, "PART_ELEMENTS", 1024)  # 2 threads x 8 parts of 2048
    split = runtime.run(block, [x], None, 2)[0]
    np.testing.assert_array_equal(split, whole)
