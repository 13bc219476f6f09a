"""Python source of a Triton matmul whose store applies an element-wise ``ir.Block``.

The epilogue is a block (``elementwise.ElementwiseFuser``'s, no reductions) over the
matmul's output shape, one of whose inputs (``value``) is the matmul's result: a bias
add, an activation, a residual add, or any chain the element-wise fuser takes. The kernel
computes a ``BM x BN`` tile of ``a @ b`` in float32 registers, rounds it to the output
dtype (as the unfused matmul's result is), then runs the block's instructions on the tile
with :func:`triton_source.instr_expr` (the same rule table as every other generated
kernel) and stores the block's outputs: the values in between never reach memory.

Shapes are flattened to a batch of 2-D problems on the host: ``a`` is ``[Z, M, K]``, ``b``
``[Z, K, N]`` (batch stride 0 when it is 2-D), the other inputs and the outputs
``[Z, M, N]`` by strides (0 in broadcast dims), so the kernel's key is the block's key
alone. Float32 products use ``input_precision="ieee"`` (no TF32), as torch's matmul
does by default.
"""

from __future__ import annotations

from ember.backends.fusion import ir
from ember.backends.fusion.triton_source import (
    HEADER,
    TL_DTYPES,
    KernelUnsupported,
    _counter,
    _narrow,
    _widen,
    check,
    compute_type,
    instr_expr,
    scalar_dtypes,
    scalar_param,
)
from ember.tensor.dtype import DType

DTYPES = (DType.F32, DType.F16)
"""Matmul dtypes the kernel takes (others run as the unfused matmul)."""


def generate(block: ir.Block, value: int, keep_value: bool) -> str:
    """The source of a module whose ``kernel`` computes ``a @ b`` then ``block`` on it.

    ``kernel[grid](a, b, *other_inputs, *outputs, [value_out], *scalars, M, N, K,
    a's (z, m, k) strides, b's (z, k, n) strides, each other input's (z, m, n) strides,
    BM=, BN=, BK=)`` with ``grid = (cdiv(M, BM) * cdiv(N, BN), Z)``; ``value`` is the
    block's input register holding the product, ``keep_value`` writes the product too
    (read after the segment), as the last output.
    """
    check(block)
    if block.axis is not None:
        raise KernelUnsupported("triton matmul: an epilogue with a reduction")
    if block.inputs[value].dtype not in DTYPES:
        raise KernelUnsupported(f"triton matmul: dtype {block.inputs[value].dtype}")
    others = [i for i in range(len(block.inputs)) if i != value]
    outs = [f"out{o}" for o in range(len(block.outputs))] + (["vout"] if keep_value else [])
    scalars = [scalar_param(k, d) for k, d in enumerate(scalar_dtypes(block))]
    strides = [f"st{i}_{d}" for i in others for d in "zmn"]
    params = (["a", "b", *(f"in{i}" for i in others), *outs, *scalars, "M", "N", "K",
               "sa_z", "sa_m", "sa_k", "sb_z", "sb_k", "sb_n", *strides,
               "BM: tl.constexpr", "BN: tl.constexpr", "BK: tl.constexpr"])  # fmt: skip
    d = block.inputs[value].dtype
    lines = HEADER.format(key=repr(("matmul", block.key(), value, keep_value))).rstrip("\n")
    w = lines.split("\n") + ["", "", "@triton.jit", f"def kernel({', '.join(params)}):"]

    def put(text: str) -> None:
        w.append("    " + text)

    for k, sd in enumerate(scalar_dtypes(block)):
        put(f"s{k} = tl.full((), s{k}, {compute_type(sd)})")
    put("pid = tl.program_id(0)")
    put("z = tl.program_id(1).to(tl.int64)")
    put("tiles_n = (N + BN - 1) // BN")
    put("rm = (pid // tiles_n) * BM + tl.arange(0, BM)")
    put("rn = (pid % tiles_n) * BN + tl.arange(0, BN)")
    put("rk = tl.arange(0, BK)")
    put("pa = a + z * sa_z + rm[:, None] * sa_m + rk[None, :] * sa_k")
    put("pb = b + z * sb_z + rk[:, None] * sb_k + rn[None, :] * sb_n")
    put("acc = tl.full((BM, BN), 0.0, tl.float32)")
    put("for k0 in range(0, K, BK):")
    put("    x = tl.load(pa, mask=(rm[:, None] < M) & (rk[None, :] + k0 < K), other=0.0)")
    put("    y = tl.load(pb, mask=(rk[:, None] + k0 < K) & (rn[None, :] < N), other=0.0)")
    precision = ', input_precision="ieee"' if d is DType.F32 else ""  # no TF32
    put(f"    acc = tl.dot(x, y, acc{precision})")
    put("    pa += BK * sa_k")
    put("    pb += BK * sb_k")
    put("mask = (rm[:, None] < M) & (rn[None, :] < N)")
    # The product rounded to its dtype, as the unfused matmul's result.
    put(f"r{value} = {_widen(f'acc.to({TL_DTYPES[d]})', d)}")
    for i in others:
        at = f"in{i} + z * st{i}_z + rm[:, None] * st{i}_m + rn[None, :] * st{i}_n"
        put(f"r{i} = {_widen(f'tl.load({at}, mask=mask, other=0)', block.inputs[i].dtype)}")
    scalar = _counter()
    n_in = len(block.inputs)
    for k, instr in enumerate(block.body):
        put(f"r{n_in + k} = {instr_expr(block, instr, lambda r: f'r{r}', scalar)}")
    put("at = z * M * N + rm[:, None] * N + rn[None, :]")
    for o, r in enumerate(block.outputs):
        put(f"tl.store(out{o} + at, {_narrow(f'r{r}', block.register_dtype(r))}, mask=mask)")
    if keep_value:
        put(f"tl.store(vout + at, {_narrow(f'r{value}', d)}, mask=mask)")
    return "\n".join(w) + "\n"

