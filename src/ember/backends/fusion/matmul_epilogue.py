"""The matmul epilogue fuser: a matmul and the element-wise ops on its output.

A linear layer is a matmul followed by its bias add, an activation (ReLU is a clamp,
GELU a chain of element-wise ops) and, in a residual block, the addition of the skip
path. Run one by one, each of those ops reads and writes the whole output once more. The
Triton runtime's matmul (``triton_matmul``) applies them in its store instead, so this
fuser takes, after a ``matmul`` record, every record the element-wise fuser would take
whose operands broadcast to the matmul's output shape exactly (a bias, a residual; never a
larger result), the first of them reading the product. Its block (:class:`MatmulEpilogue`)
holds the matmul record and the epilogue's ``ir.Block``, whose input ``value`` is the
product: the kernels are generated from that block, never written per layer.

The executor runs it as one Triton kernel where the tuner chose that over the unfused
matmul and ops (per block key and work bucket; the first run of a bucket is the fused
kernel, then both are timed), and record by record otherwise. The structure follows
``conv_epilogue.py``: a fuser, a block, a template for streams of the same plan key.

On NdArray values the numba GEMM takes a bias only (its sums start from it):
:class:`BiasedMatmulFuser` takes a product by a matrix and the addition of its ``[N]``
bias, into the same :class:`MatmulEpilogue`, and leaves what follows to the element-wise
block after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.backends.fusion.elementwise import ElementwiseFuser, Template, _broadcast, elementwise
from ember.backends.fusion.fuser import Properties, Status, Taking
from ember.backends.fusion.handle import Slot
from ember.backends.fusion.ir import Block
from ember.backends.fusion.stream import Record
from ember.tensor.dtype import DType

DTYPES = (DType.F32, DType.F16)


@dataclass(frozen=True)
class MatmulEpilogue:
    """A fused segment: ``matmul`` (the record), the epilogue ``block`` over its output,
    the slots of the block's inputs (``inputs[value]`` is the product's slot) and
    outputs, and whether the product itself is written too (``keep_value``: read after
    the segment)."""

    matmul: Record
    block: Block
    value: int
    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    keep_value: bool


@dataclass
class MatmulTemplate:
    """A :class:`MatmulEpilogue` in relative form: the epilogue's element-wise template,
    the product's register and whether it is written."""

    epilogue: Template
    value: int
    keep_value: bool

    def bind(self, records: list[Record]) -> MatmulEpilogue | None:
        if not records or records[0].op.name != "matmul":
            return None
        fused = self.epilogue.bind(records[1:])
        product = records[0].outputs[0]
        if (fused is None or fused.block.shape != product.shape
                or fused.inputs[self.value] is not product):  # fmt: skip
            return None
        return MatmulEpilogue(records[0], fused.block, self.value, fused.inputs, fused.outputs,
                              self.keep_value)  # fmt: skip


class MatmulEpilogueFuser(Taking):
    """Takes a ``matmul`` record and the epilogue records after it (see the module doc).

    Args:
        can_fuse: whether a slot's values reach the Triton runtime.
    """

    name = "matmul+epilogue"

    def __init__(self, can_fuse) -> None:
        self.can_fuse = can_fuse
        self.reset()

    def reset(self) -> None:
        self.records: list[Record] = []
        self.epilogue = ElementwiseFuser(self.can_fuse)
        self._template: MatmulTemplate | None = None
        self._status = Status.OPEN

    def properties(self) -> Properties:
        n = len(self.records)
        return Properties(score=n, ready=n >= 2)

    def might_take(self, record: Record) -> bool:
        return not record.multi and (record.op.name == "matmul" or elementwise(record))

    def fuse(self, record: Record) -> None:
        if self._status is Status.CLOSED:
            return
        took = self._epilogue(record) if self.records else self._matmul(record)
        if not took:
            self._status = Status.CLOSED
            return
        self.records.append(record)

    def _matmul(self, record: Record) -> bool:
        """Whether ``record`` is a matmul the kernel takes: float32 or float16, at least 2-d,
        ``b`` 2-d or of ``a``'s batch dims."""
        if record.op.name != "matmul" or record.multi or len(record.inputs) != 2:
            return False
        a, b = record.inputs
        out = record.outputs[0]
        if not all(s.dtype is out.dtype and self.can_fuse(s) for s in (a, b, out)):
            return False
        if out.dtype not in DTYPES or len(a.shape) < 2 or len(b.shape) < 2:
            return False
        return len(b.shape) == 2 or a.shape[:-2] == b.shape[:-2]

    def _epilogue(self, record: Record) -> bool:
        """Whether ``record`` continues the epilogue: element-wise, every operand
        broadcasting to the product's shape exactly, the first reading the product."""
        product = self.records[0].outputs[0]
        if not elementwise(record) or record.multi:
            return False
        if len(self.records) == 1 and product not in record.inputs:
            return False
        for s in (*record.inputs, *record.outputs):
            if _broadcast(product.shape, s.shape) != product.shape:
                return False
        if record.outputs[0].shape != product.shape:
            return False
        self.epilogue.fuse(record)
        return self.epilogue.status() is Status.OPEN and len(self.epilogue) == len(self.records)

    def finish(self, keep: set[int]) -> MatmulEpilogue:
        product = self.records[0].outputs[0]
        fused = self.epilogue.finish(keep)
        value = fused.inputs.index(product)
        keep_value = product.id in keep
        self._template = MatmulTemplate(self.epilogue.template(fused), value, keep_value)
        return MatmulEpilogue(self.records[0], fused.block, value, fused.inputs, fused.outputs,
                              keep_value)  # fmt: skip

    def template(self, fused: MatmulEpilogue) -> MatmulTemplate:
        """``fused`` (this fuser's :meth:`finish`) in relative form."""
        return self._template


class BiasedMatmulFuser(MatmulEpilogueFuser):
    """Takes a ``matmul`` by a matrix (a linear layer's weight) and the addition of a bias
    ``[N]`` to its product, for the numba GEMM on NdArray values, whose sums start from the
    bias (``numba_gemm.matmul``): a linear layer's output is written once, where the
    addition read and wrote it once more. What follows the addition (an activation, a
    residual and a norm) stays in the element-wise block after it, which reads the biased
    product as it read the product.

    Args:
        can_fuse: whether a slot's values reach the CPU runtime.
    """

    name = "matmul+bias"

    def _matmul(self, record: Record) -> bool:
        if not super()._matmul(record):
            return False
        return len(record.inputs[1].shape) == 2 and record.outputs[0].dtype is DType.F32

    def _epilogue(self, record: Record) -> bool:
        if len(self.records) > 1 or record.op.name != "add" or len(record.inputs) != 2:
            return False
        product = self.records[0].outputs[0]
        bias = [s for s in record.inputs if s is not product]
        if len(bias) != 1 or bias[0].shape != product.shape[-1:]:
            return False
        if bias[0].dtype is not product.dtype:
            return False
        return super()._epilogue(record)
