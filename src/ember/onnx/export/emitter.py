"""The emitter: what an exporter writes ONNX nodes with.

It names ONNX values (a graph input by its input name, a parameter by its module path,
an op output by a fresh name, any other tensor as a constant initializer of its traced
values), appends nodes and initializers, and makes shape attributes symbolic when the
export has dynamic axes (:mod:`ember.onnx.export.symbolic`).

Exporters use it like::

    @exporter("add")
    def add(e: Emitter, call: OpCall) -> None:
        e.node("Add", [e.input(call, 0), e.input(call, 1)], [e.output(call)])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import NodeProto, TensorProto, helper, numpy_helper

from ember.onnx.export.errors import ExportError, UnsupportedExportError
from ember.onnx.export.symbolic import DynamicDim, match
from ember.onnx.export.tracer import OpCall, Trace, Traced
from ember.tensor.data import numpy_dtype
from ember.tensor.dtype import DType

ONNX_TYPE: dict[DType, int] = {
    DType.F64: TensorProto.DOUBLE, DType.F32: TensorProto.FLOAT, DType.F16: TensorProto.FLOAT16,
    DType.BF16: TensorProto.BFLOAT16, DType.I64: TensorProto.INT64, DType.I32: TensorProto.INT32,
    DType.I16: TensorProto.INT16, DType.I8: TensorProto.INT8, DType.U64: TensorProto.UINT64,
    DType.U32: TensorProto.UINT32, DType.U16: TensorProto.UINT16, DType.U8: TensorProto.UINT8,
    DType.BOOL: TensorProto.BOOL,
}  # fmt: skip
"""ember dtypes with an ONNX tensor type."""


def onnx_type(dtype: DType) -> int:
    """The ONNX tensor type of ``dtype``; an ExportError for one ONNX lacks (f8, int4)."""
    try:
        return ONNX_TYPE[dtype]
    except KeyError:
        raise ExportError(f"ONNX export: dtype {dtype.value} has no ONNX tensor type here") from None


class Emitter:
    """Builds the nodes and initializers of one exported graph.

    Args:
        trace: the trace being translated.
        alternate: the same forward traced with other sizes of the dynamic axes (aligned
            call by call), or None without dynamic axes.
        opset: the default-domain opset the nodes must exist in.
        names: the ONNX name of each graph input and parameter handle.
        dynamic: the dynamic input dims (input name, axis, size in each trace).
    """

    def __init__(self, trace: Trace, alternate: Trace | None, opset: int,
                 names: dict[int, str], dynamic: Sequence[DynamicDim]) -> None:  # fmt: skip
        self.trace = trace
        self.alternate = alternate
        self.opset = opset
        self.nodes: list[NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.dynamic = list(dynamic)
        self._names = dict(names)
        self._used = set(names.values())
        self._constants: dict[tuple, str] = {}
        self._dim_values: dict[tuple[str, int], str] = {}
        self._shapes: dict[str, str] = {}
        self._scope = ""
        self._counter = 0

    # ------------------------------------------------------------------ names
    def fresh(self, hint: str) -> str:
        """A value or node name not used yet, built from ``hint``."""
        while True:
            self._counter += 1
            name = f"{hint}_{self._counter}"
            if name not in self._used:
                self._used.add(name)
                return name

    def name(self, handle: Traced) -> str:
        """The ONNX value of ``handle``: known, or a new constant initializer of its values."""
        found = self._names.get(id(handle))
        if found is None:
            found = self.const(self.trace.value(handle), "const")
            self._names[id(handle)] = found
        return found

    def known(self, handle: Traced) -> str | None:
        """The ONNX value of ``handle`` if it has one already (None: not named yet)."""
        return self._names.get(id(handle))

    def input(self, call: OpCall, i: int) -> str:
        """The ONNX value of operand ``i`` of ``call`` (``""``, ONNX's absent input, for a
        missing optional operand)."""
        handle = call.inputs[i]
        return "" if handle is None else self.name(handle)

    def output(self, call: OpCall, i: int = 0) -> str:
        """The ONNX value that output ``i`` of ``call`` is to be written to."""
        handle = call.outputs[i]
        found = self._names.get(id(handle))
        if found is None:
            found = self._names[id(handle)] = self.fresh(call.op.name)
        return found

    def bind(self, call: OpCall, value: str, i: int = 0) -> None:
        """Makes output ``i`` of ``call`` the existing value ``value`` (no node needed)."""
        self._names[id(call.outputs[i])] = value

    # ------------------------------------------------------------------ nodes and constants
    def node(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str] | int = 1,
             **attrs: Any) -> str:  # fmt: skip
        """Appends a node; returns its (first) output. ``outputs`` is names or a count of
        fresh ones. Attributes that are None are left out."""
        return self.node_outputs(op_type, inputs, outputs, **attrs)[0]

    def node_outputs(self, op_type: str, inputs: Sequence[str],
                     outputs: Sequence[str] | int = 1, **attrs: Any) -> list[str]:  # fmt: skip
        """:meth:`node` returning all its outputs."""
        if isinstance(outputs, int):
            outputs = [self.fresh(op_type.lower()) for _ in range(outputs)]
        scope = self._scope or "model"
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs),
                                           name=self.fresh(f"{scope}/{op_type}"), **attrs))  # fmt: skip
        return list(outputs)

    def const(self, value: Any, hint: str = "const", dtype: DType | None = None) -> str:
        """An initializer holding ``value`` (an array or nested numbers; of ``dtype`` if given).
        Equal small constants share one initializer."""
        array = np.asarray(value, dtype=numpy_dtype(dtype) if dtype is not None else None)
        if array.dtype == np.float64 and dtype is None and not isinstance(value, np.ndarray):
            array = array.astype(np.float32)
        key = None
        if array.size <= 16:
            key = (array.dtype.str, array.shape, array.tobytes())
            if key in self._constants:
                return self._constants[key]
        if array.dtype.name == "bfloat16":
            raise ExportError("ONNX export: bf16 constants are not written yet")
        name = self.fresh(hint)
        tensor = numpy_helper.from_array(array.copy(order="C"), name)  # keeps a 0-d shape
        self.initializers.append(tensor)
        if key is not None:
            self._constants[key] = name
        return name

    def ints(self, values: Sequence[int]) -> str:
        """A 1-d int64 constant."""
        return self.const(np.asarray(list(values), dtype=np.int64), "ints")

    def scalar_like(self, call: OpCall, value: Any, i: int = 0) -> str:
        """A 0-d constant of ``value`` in the dtype of operand ``i`` of ``call``."""
        aval = call.input_avals[i]
        assert aval is not None
        return self.const(np.asarray(value, dtype=numpy_dtype(aval.dtype)), "scalar")

    def set_scope(self, path: str) -> None:
        """The module path that names the nodes appended next."""
        self._scope = path

    # ------------------------------------------------------------------ attributes
    def unsupported(self, call: OpCall, reason: str) -> UnsupportedExportError:
        """The error an exporter raises for an attribute value it cannot write."""
        return UnsupportedExportError(call.op.name, call.primitive, call.module_path, reason)

    def _alternate_call(self, call: OpCall) -> OpCall | None:
        return None if self.alternate is None else self.alternate.calls[call.index]

    def static(self, call: OpCall, name: str) -> Any:
        """Attribute ``name`` of ``call``, which must not depend on a dynamic axis."""
        value = call.attr(name)
        other = self._alternate_call(call)
        if other is not None and other.attr(name) != value:
            raise ExportError(
                f"ONNX export: attribute {name!r} of op {call.op.name!r} in module "
                f"{call.module_path or '<root>'!r} changes with the dynamic axes ({value!r} vs "
                f"{other.attr(name)!r}) and its ONNX form takes it as a constant; export "
                f"without that dynamic axis")
        return value

    def alternate_attr(self, call: OpCall, name: str) -> Any:
        """Attribute ``name`` of ``call`` in the alternate trace (the same value without one)."""
        other = self._alternate_call(call)
        return call.attr(name) if other is None else other.attr(name)

    def static_dims(self, call: OpCall, i: int, dims: Sequence[int]) -> list[int]:
        """The sizes of ``dims`` of operand ``i``, which the op's ONNX form bakes in: they
        must not change with the dynamic axes."""
        aval = call.input_avals[i]
        assert aval is not None
        traced = [aval.shape[d] for d in dims]
        other = [self.alternate_input_shape(call, i)[d] for d in dims]
        if traced != other:
            raise ExportError(
                f"ONNX export: op {call.op.name!r} in module {call.module_path or '<root>'!r} "
                f"bakes in the sizes {traced} of its input, which change with the dynamic axes "
                f"({other}); export without that dynamic axis")
        return traced

    def alternate_input_shape(self, call: OpCall, i: int) -> tuple[int, ...]:
        other = self._alternate_call(call)
        aval = (other or call).input_avals[i]
        assert aval is not None
        return aval.shape

    def sizes(self, call: OpCall, traced: Sequence[int], alternate: Sequence[int],
              fallback: Any = None) -> str:
        """A 1-d int64 value holding ``traced``, with each entry that differs in
        ``alternate`` computed from the dynamic input dims at run time.

        ``fallback(j)`` may give an int to write for a differing entry ``j`` instead (an
        exporter's own encoding, e.g. -1 in a reshape, 1 in an expand); it returns None to
        ask for the symbolic form.
        """
        traced, alternate = list(traced), list(alternate)
        if traced == alternate:
            return self.ints(traced)
        pieces: list[str] = []
        run: list[int] = []
        for j, (a, b) in enumerate(zip(traced, alternate, strict=True)):
            if a == b or (fallback is not None and fallback(j) is not None):
                run.append(a if a == b else fallback(j))
                continue
            if run:
                pieces.append(self.ints(run))
                run = []
            pieces.append(self.symbolic(call, a, b))
        if run:
            pieces.append(self.ints(run))
        return pieces[0] if len(pieces) == 1 else self.node("Concat", pieces, axis=0)

    def symbolic(self, call: OpCall, traced: int, alternate: int) -> str:
        """A 1-element int64 value that is ``traced`` in the trace and ``alternate`` in the
        alternate one, computed from the dynamic input dims."""
        formula = match(self.dynamic, traced, alternate)
        if formula is None:
            raise ExportError(
                f"ONNX export: op {call.op.name!r} in module {call.module_path or '<root>'!r} "
                f"has a size that changes with the dynamic axes ({traced} vs {alternate}) in "
                f"a way not found from them (a multiple or offset of one dynamic dim, or a "
                f"product of two)")
        dims = [self.dim_value(d.input, d.axis) for d in formula.dims]
        value = dims[0]
        for other in dims[1:]:
            value = self.node("Mul", [value, other])
        if formula.scale != 1:
            value = self.node("Mul", [value, self.ints([formula.scale])])
        if formula.offset:
            value = self.node("Add", [value, self.ints([formula.offset])])
        return value

    def dim_value(self, input_name: str, axis: int) -> str:
        """A 1-element int64 value: the size of ``axis`` of graph input ``input_name``."""
        key = (input_name, axis)
        if key not in self._dim_values:
            if input_name not in self._shapes:
                self._shapes[input_name] = self.node("Shape", [input_name])
            shape = self._shapes[input_name]
            self._dim_values[key] = self.node("Gather", [shape, self.ints([axis])], axis=0)
        return self._dim_values[key]
