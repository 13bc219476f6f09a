"""The interpreter runtime: runs a block's instructions one by one through NdArray's ops.

It computes exactly what the unfused ops compute on ``ndarray`` (the same kernels, one
array per register), so it is how the fusers are tested without a compiler; the numba
runtime (``numba_runtime.py``) has the same interface and computes a block in one pass.

Example:
    >>> import numpy as np
    >>> from ember.backends.fusion.ir import Block, Input, Instr
    >>> from ember.tensor.dtype import DType
    >>> f32 = DType.F32
    >>> block = Block((2,), (Input((2,), f32),),
    ...               (Instr("mul_scalar", (0,), (2.0,), (2,), f32),
    ...                Instr("exp", (1,), (), (2,), f32)), outputs=(2,))
    >>> InterpreterRuntime().run(block, [np.zeros(2, np.float32)])[0].tolist()
    [1.0, 1.0]
"""

from __future__ import annotations

import numpy as np

from ember.backend.ops import OPS
from ember.backends.fusion.buffers import BufferPool, PooledOutputs
from ember.backends.fusion.ir import Block
from ember.backends.ndarray import NdArray


class InterpreterRuntime(PooledOutputs):
    """Runs blocks with NdArray's kernels, one instruction at a time."""

    name = "interpreter"

    def __init__(self) -> None:
        self.backend = NdArray()
        # Outputs come from a pool as the numba runtime's do, so the executor's memory
        # rules (buffers handed back, writes over an input at its last use) run here too.
        self.pool = BufferPool()

    def run(self, block: Block, inputs: list[np.ndarray],
            out: list[np.ndarray | None] | None = None) -> list[np.ndarray]:  # fmt: skip
        """The block's outputs for ``inputs`` (arrays of the input registers' shapes); written
        into ``out`` when given (arrays of the output registers' shapes; a None entry, and
        every output without ``out``, comes from the pool). Every register is computed, and
        copied where it shares memory with an output, before any output is written, so an
        output may be an input."""
        registers = list(inputs)
        backend = self.backend
        for instr in block.body:
            kind = block.register_dtype(instr.args[0]).kind
            primitive = getattr(backend, OPS[instr.op].primitive(kind))
            registers.append(primitive(*[registers[a] for a in instr.args], *instr.attrs))
        targets = out if out is not None else [None] * len(block.outputs)
        given = [t for t in targets if t is not None]
        results = []
        for r in block.outputs:
            result = registers[r]
            # A result that is (a view of) an input written over by another output (an op
            # that returned its operand itself) is copied before any output is written.
            if any(np.may_share_memory(result, t) for t in given):
                result = np.array(result)
            results.append(result)
        made = []
        for r, target, result in zip(block.outputs, targets, results, strict=True):
            if target is None:
                target = self.pool.take(block.register_shape(r), result.dtype)
            target[...] = result
            made.append(target)
        return made
