"""The export tracer: a decorator over the op table that records every op a forward runs.

It is :class:`ember.backends.trace.Trace` grown for export. Each op call becomes an
:class:`OpCall` holding the op, the primitive, the identities of its tensor operands and
outputs, its attributes, the shapes and dtypes on both sides and the path of the module
that ran it. The real op runs as well, so values flow and every shape is concrete.

Identity is what links the calls into a graph: the tracer's primitives are :class:`Traced`
handles, a fresh one per op output, so "this operand is that op's output" is an ``is``
test that no buffer reuse of the inner backend can fool.

A composite op with an ONNX form is recorded as itself (a ``softmax`` becomes one
``Softmax`` node); one without runs the protocol's default on the tracer, so its
primitives are recorded instead. A module with an exporter of its own (an LSTM, whose time
loop is Python) is recorded as one call: its ops run unrecorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ember.backend.base import Backend
from ember.backend.decorator import Decorator
from ember.backend.ops import OpDef, primitives
from ember.backend.rules import AVal
from ember.module import Module
from ember.module.param import Param
from ember.onnx.export.errors import ExportError
from ember.tensor import Tensor
from ember.tensor.dtype import Kind

# Custom ops registered later are Float ops (ember.backend.custom_op): the default below.
_KIND_OF: dict[str, Kind] = {name: kind for _op, kind, name in primitives()}


class Traced:
    """A primitive of the tracer: the inner backend's primitive, one handle per op output."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Traced@{id(self):x}"


@dataclass(eq=False)
class OpCall:
    """One recorded op call.

    Attributes:
        index: the call's position in the trace.
        op: the op table entry.
        primitive: the backend method that ran (``float_add``).
        kind: the kind of the tensors the primitive is for.
        inputs: the tensor operands in the table's order (``cat``'s list spread out, an
            absent optional operand as None).
        attrs: the attributes, in the table's order.
        outputs: the outputs (one, or several for ops that return a tuple).
        input_avals / output_avals: shapes and dtypes of the operands and outputs.
        module_path: the path of the innermost module running when the op ran
            (``"encoder.layers.0.attention"``; ``""`` for the exported module itself).
        module: for a module exported whole, the module (its op is a stand-in, ``module:``
            and the class name); None for an op.
    """

    index: int
    op: OpDef
    primitive: str
    kind: Kind
    inputs: tuple[Traced | None, ...]
    attrs: tuple[Any, ...]
    outputs: tuple[Traced, ...]
    input_avals: tuple[AVal | None, ...]
    output_avals: tuple[AVal, ...]
    module_path: str
    module: Module | None = None

    def attr(self, name: str) -> Any:
        """The attribute called ``name`` in the op table (absent trailing ones are None)."""
        position = self.op.attrs.index(name)
        return self.attrs[position] if position < len(self.attrs) else None


class Tracer(Decorator):
    """Records every op call into ``calls`` while ``recording``, and runs it.

    Args:
        inner: the backend that computes the values.
        has_form: whether an op has an ONNX form; a composite op without one is decomposed
            into its primitives on the tracer.
        whole: whether a module is exported whole (an LSTM as one ONNX node): its call is
            recorded as one, not its ops.
    """

    prefix = "export-trace"

    def __init__(self, inner: Backend, has_form: Callable[[OpDef], bool],
                 whole: Callable[[Module], bool] = lambda module: False) -> None:  # fmt: skip
        super().__init__(inner)
        self.has_form = has_form
        self.whole = whole
        self.calls: list[OpCall] = []
        self.recording = False
        self.scopes: list[str] = [""]
        # Tensors whose values depend on the example inputs: reading one back to Python may
        # mean the forward branches on data, which one trace cannot capture.
        self.from_inputs: set[int] = set()
        self.reads: list[str] = []  # module paths that read values computed from inputs
        self._alive: list[Traced] = []  # keeps ids unique while the trace is used

    def wrap(self, inner_prim: Any) -> Traced:
        handle = Traced(inner_prim)
        self._alive.append(handle)
        return handle

    def unwrap(self, prim: Any) -> Any:
        return prim.value

    def call(self, op: OpDef, name: str, args: tuple) -> Any:
        if not self.recording:
            return self.forward(op, name, args)
        operands = self.operands(op, args)
        if op.name == "into_data":
            if any(id(t) in self.from_inputs for t in operands):
                # A check (indices in range) or a branch on data: export tells them apart
                # by tracing again with other input values (see ``export``).
                self.reads.append(self.scopes[-1])
            return self.forward(op, name, args)
        if op.composite and not self.has_form(op):
            return getattr(Backend, name)(self, *args)
        out = self.forward(op, name, args)
        outputs = out if isinstance(out, tuple) else (out,)
        n = len(op.inputs)
        self.record(op, name, _KIND_OF.get(name, Kind.FLOAT), tuple(operands), tuple(args[n:]),
                    outputs)  # fmt: skip
        return out

    def record(self, op: OpDef, name: str, kind: Kind, operands: tuple, attrs: tuple,
               outputs: tuple, module: Module | None = None) -> None:  # fmt: skip
        """Appends one call (an op, or a module exported whole) to ``calls``."""
        self.calls.append(OpCall(
            len(self.calls), op, name, kind, operands, attrs, outputs,
            tuple(None if t is None else self._aval(t) for t in operands),
            tuple(self._aval(t) for t in outputs), self.scopes[-1], module))  # fmt: skip
        if any(id(t) in self.from_inputs for t in operands if t is not None):
            self.from_inputs.update(id(t) for t in outputs)

    def run_whole(self, module: Module, run: Callable[..., Any], args: tuple,
                  kwargs: dict) -> Any:  # fmt: skip
        """Runs ``module`` without recording its ops and records the call as one, whose
        inputs and outputs are the tensors among its arguments and results, in order."""
        self.recording = False
        try:
            out = run(module, *args, **kwargs)
        finally:
            self.recording = True
        op = _module_op(type(module))
        inputs = tuple(t.into_primitive() for t in tensors_in((args, list(kwargs.values()))))
        outputs = tuple(t.into_primitive() for t in tensors_in(out))
        self.record(op, op.name, Kind.FLOAT, inputs, (), outputs, module)
        return out

    def _aval(self, prim: Traced) -> AVal:
        return AVal(self.shape(prim), self.dtype(prim))


@dataclass
class Trace:
    """What one traced forward gave.

    Attributes:
        calls: the op calls in order.
        inputs: the graph inputs (one per example input tensor).
        params: each parameter's handle with its module path (``conv1.weight``).
        outputs: the forward's output tensors, flattened in order.
        tracer: the tracer backend (it reads constants' values back).
        reads: the module paths where the forward read values computed from the inputs.
    """

    calls: list[OpCall]
    inputs: list[Traced]
    params: dict[int, tuple[str, Traced]]
    outputs: list[Traced]
    tracer: Tracer
    reads: list[str] = field(default_factory=list)
    input_avals: list[AVal] = field(default_factory=list)
    output_avals: list[AVal] = field(default_factory=list)

    def value(self, handle: Traced) -> Any:
        """The values of ``handle`` as a NumPy array."""
        kind = self.tracer.inner.dtype(handle.value).kind
        into_data = getattr(self.tracer.inner, f"{kind.prefix}_into_data")
        return into_data(handle.value).to_numpy()


def modules_in(value: Any, path: str = "") -> Iterator[tuple[str, Module]]:
    """Every module in ``value`` (itself included) with its path, as ``params()`` names them."""
    if isinstance(value, Module):
        yield path, value
        items: Any = value.fields()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    elif isinstance(value, dict):
        items = value.items()
    else:
        return
    for name, item in items:
        if isinstance(item, Module | list | tuple | dict) and not isinstance(item, Param):
            yield from modules_in(item, f"{path}.{name}" if path else str(name))


@contextlib.contextmanager
def module_scopes(root: Module, tracer: Tracer) -> Iterator[None]:
    """While active, calling a module of ``root`` pushes its path onto ``tracer.scopes``.

    ``Module.__call__`` is swapped for the duration (process-wide: export one model at a
    time per process), and put back however the forward ends.
    """
    paths = {id(module): path for path, module in modules_in(root)}
    original = Module.__call__

    def scoped_call(self: Module, *args: Any, **kwargs: Any) -> Any:
        path = paths.get(id(self))
        if path is None:  # a module the forward built itself: its caller's scope
            return original(self, *args, **kwargs)
        tracer.scopes.append(path)
        try:
            if tracer.recording and tracer.whole(self):
                return tracer.run_whole(self, original, args, kwargs)
            return original(self, *args, **kwargs)
        finally:
            tracer.scopes.pop()

    Module.__call__ = scoped_call  # type: ignore[method-assign]
    try:
        yield
    finally:
        Module.__call__ = original  # type: ignore[method-assign]


_MODULE_OPS: dict[type, OpDef] = {}


def _module_op(cls: type) -> OpDef:
    """The stand-in op of a module exported whole (not in the op table)."""
    if cls not in _MODULE_OPS:
        _MODULE_OPS[cls] = OpDef(f"module:{cls.__qualname__}", frozenset({Kind.FLOAT}), (), (),
                                 None, "module_call", prefixed=False)  # fmt: skip
    return _MODULE_OPS[cls]


def tensors_in(value: Any) -> list[Tensor]:
    """The tensors in ``value`` (a tensor, or tuples / lists / named tuples of them and of
    other values), in order."""
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for item in value for t in tensors_in(item)]
    return []


def _flatten_outputs(out: Any) -> list[Tensor]:
    tensors = tensors_in(out)
    if not tensors or (not isinstance(out, Tensor | list | tuple)):
        raise ExportError(f"ONNX export: the forward must return a tensor or (nested) tuples "
                          f"/ lists of tensors, got {type(out).__name__}")
    return tensors


def trace(module: Module, inputs: Sequence[Tensor], has_form: Callable[[OpDef], bool],
          whole: Callable[[Module], bool] = lambda module: False) -> Trace:
    """Runs ``module(*inputs)`` on a tracer and returns what it recorded.

    The module runs for inference: on an autodiff device its ``valid()`` twin is traced
    (dropout off, batch norm on running statistics).
    """
    tensors = [x for x in inputs if isinstance(x, Tensor)]
    if not tensors:
        raise ExportError("ONNX export: example_inputs holds no tensor")
    device = tensors[0].device
    if hasattr(device.backend, "backward"):
        module = module.valid()
        inputs = [x.inner() if isinstance(x, Tensor) else x for x in inputs]
        device = device.inner()
    tracer_device = device.wrap(lambda backend: Tracer(backend, has_form, whole))
    tracer = tracer_device.backend
    assert isinstance(tracer, Tracer)
    # Moving onto the tracer runs ops too; they are not part of the graph.
    moved = module.to_device(tracer_device)
    traced_inputs = [x.to_device(tracer_device) if isinstance(x, Tensor) else x for x in inputs]
    params = {}
    for path, param in moved.params():
        handle = param.val().into_primitive()
        params[id(handle)] = (path, handle)
    handles = [x.into_primitive() for x in traced_inputs if isinstance(x, Tensor)]
    tracer.from_inputs.update(id(h) for h in handles)
    tracer.recording = True
    try:
        with module_scopes(moved, tracer):
            out = moved(*traced_inputs)
    finally:
        tracer.recording = False
    outputs = [t.into_primitive() for t in _flatten_outputs(out)]
    return Trace(tracer.calls, handles, params, outputs, tracer, tracer.reads,
                 [tracer._aval(h) for h in handles], [tracer._aval(h) for h in outputs])
