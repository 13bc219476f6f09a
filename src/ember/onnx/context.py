"""What a converter sees of its node: inputs, outputs, attributes, and ways to declare state.

A converter receives a :class:`NodeContext` and returns Python source lines that
assign its outputs. The same converter serves two purposes: at import time, on a node
whose inputs are all constants, the lines run on NumPy (ember's NdArray backend) and
the outputs become constants (constant folding); otherwise the lines become part of
the generated ``forward``. A converter does not need to know which: it writes
expressions from ``node.input(i).expr`` and the declarations it asks for.

The node context sits between the model's IR and the translator: it knows the translator
only as a :class:`Scope` (what a node needs of it), so the importer's modules depend one
way, ``ir`` -> ``context`` -> ``translate`` -> ``codegen`` -> ``importer``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, Protocol

import numpy as np

from ember.onnx.ir import Dim, Node
from ember.onnx.registry import ConverterSpec, UnsupportedOnnxError
from ember.tensor import DType
from ember.tensor.data import dtype_of_numpy

_REQUIRED = object()


class Names(Protocol):
    """Where fresh local names come from (:class:`ember.onnx.translate.Namer`)."""

    def fresh(self, hint: str) -> str: ...


class Subgraph(Protocol):
    """A subgraph translated for its node's converter (:class:`ember.onnx.translate.Body`).

    Attributes:
        inputs: the local variable of each subgraph input (the converter assigns them).
        lines: the body's code; it reads ``inputs`` and outer values.
    """

    inputs: list[str]
    lines: list[str]

    @property
    def num_outputs(self) -> int: ...

    def output(self, index: int) -> str: ...

    def output_const(self, index: int) -> np.ndarray | None: ...

    def output_trainable(self, index: int) -> bool: ...

    def output_shape(self, index: int) -> tuple[Any, ...] | None: ...

    def output_dtype(self, index: int) -> DType | None: ...

    def input_used(self, index: int) -> bool: ...


class Scope(Protocol):
    """What a node needs of the translator (:class:`ember.onnx.translate.Translator`):
    what is known of values by their ONNX names, and ways to declare module state."""

    names: Names

    def const_value(self, name: str) -> np.ndarray | None: ...

    def expr_of(self, name: str, node: NodeContext | None) -> str: ...

    def shape_of(self, name: str) -> tuple[Any, ...] | None: ...

    def dtype_of(self, name: str) -> DType | None: ...

    def is_used(self, name: str) -> bool: ...

    def add_param(self, value: np.ndarray, hint: str, trainable: bool | None,
                  node: NodeContext | None) -> str: ...  # fmt: skip

    def add_layer(self, hint: str, annotation: str, build: str, params: dict[str, np.ndarray],
                  imports: tuple[str, ...], node: NodeContext) -> str: ...  # fmt: skip

    def body(self, proto: Any, bind: Sequence[str | None] | None = None,
             keep: Sequence[bool] | None = None) -> Subgraph: ...  # fmt: skip


class Value:
    """One input of a node: its expression, and what is known about it at import time.

    ``expr`` is the Python expression that gives the tensor in generated code (a local
    variable, or a module field for a constant), or ``"None"`` for an absent optional
    input. ``const`` is the value when it is known at import time (an initializer, a
    ``Constant`` or a folded node), else None.
    """

    def __init__(self, node: NodeContext, name: str) -> None:
        self._node = node
        self.name = name

    @property
    def present(self) -> bool:
        """False for an optional input the model leaves out."""
        return bool(self.name)

    @property
    def const(self) -> np.ndarray | None:
        return self._node._translator.const_value(self.name) if self.name else None

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def expr(self) -> str:
        if not self.name:
            return "None"
        return self._node._translator.expr_of(self.name, self._node)

    @property
    def shape(self) -> tuple[Dim, ...] | None:
        """One entry per dim (a size, a dynamic dim's name, or None), or None if unknown."""
        return self._node._translator.shape_of(self.name) if self.name else None

    @property
    def static_shape(self) -> tuple[int, ...] | None:
        shape = self.shape
        if shape is None or not all(isinstance(d, int) for d in shape):
            return None
        return shape  # type: ignore[return-value]

    @property
    def rank(self) -> int | None:
        shape = self.shape
        return None if shape is None else len(shape)

    @property
    def dtype(self) -> DType | None:
        return self._node._translator.dtype_of(self.name) if self.name else None

    def ints(self) -> list[int]:
        """The constant value as a list of Python ints (for shape-like inputs)."""
        value = self.const
        if value is None:
            self._node.unsupported(f"input {self.name!r} must be a constant known at import time")
        return [int(v) for v in np.asarray(value).reshape(-1)]

    def __repr__(self) -> str:
        return f"Value({self.name!r})"


class NodeContext:
    """The node a converter translates.

    Attributes:
        name: the node's name (a made-up ``Op_index`` when the model has none).
        op_type, domain: the ONNX op.
        opset: the model's opset version for the node's domain.
        attrs: the node's attributes, parsed (ints, floats, strings, NumPy arrays, lists).
        outputs: the Python variable name of each output.
        folding: True when the lines run at import time (all inputs are constants).
    """

    def __init__(self, translator: Scope, node: Node, spec: ConverterSpec, opset: int,
                 outputs: Sequence[str], folding: bool) -> None:  # fmt: skip
        self._translator = translator
        self._node = node
        self.spec = spec
        self.name = node.label
        self.op_type = node.op_type
        self.domain = node.domain
        self.opset = opset
        self.attrs: Mapping[str, Any] = node.attrs
        self.outputs = list(outputs)
        self.folding = folding
        self.constants: dict[int, np.ndarray] = {}

    # ------------------------------------------------------------------ inputs
    @property
    def num_inputs(self) -> int:
        return len(self._node.inputs)

    def input(self, index: int) -> Value:
        """Input ``index``; an absent one (``present`` False) past the node's last input."""
        names = self._node.inputs
        return Value(self, names[index] if index < len(names) else "")

    @property
    def inputs(self) -> list[Value]:
        return [Value(self, n) for n in self._node.inputs]

    def output_shape(self, index: int = 0) -> tuple[Dim, ...] | None:
        names = self._node.outputs
        return self._translator.shape_of(names[index]) if index < len(names) else None

    def output_dtype(self, index: int = 0) -> DType | None:
        names = self._node.outputs
        return self._translator.dtype_of(names[index]) if index < len(names) else None

    def output_used(self, index: int) -> bool:
        """Whether anything reads output ``index`` (optional outputs often are not)."""
        names = self._node.outputs
        return index < len(names) and self._translator.is_used(names[index])

    # ------------------------------------------------------------------ attributes
    def attr(self, name: str, default: Any = _REQUIRED) -> Any:
        """The attribute ``name``; ``default`` when absent (an error if no default is given)."""
        if name in self.attrs:
            return self.attrs[name]
        if default is _REQUIRED:
            self.unsupported(f"the required attribute {name!r} is missing")
        return default

    # ------------------------------------------------------------------ declarations
    def param(self, value: np.ndarray, hint: str, *, trainable: bool | None = None) -> str:
        """Declares a module field holding ``value`` (a Param); returns the expression
        reading it. Float values are trainable unless ``trainable`` says otherwise."""
        return self._translator.add_param(np.asarray(value), hint, trainable, self)

    def layer(self, hint: str, annotation: str, build: str, params: Mapping[str, np.ndarray],
              imports: Sequence[str]) -> str:  # fmt: skip
        """Declares a sub-module field (an ember layer) and returns the expression of it.

        Args:
            hint: a name for the field (sanitized and made unique).
            annotation: the field's type as written in the class (``"Linear"``).
            build: an expression that builds the layer on ``device`` (any weights; the
                record overwrites them): ``"LinearConfig(4, 3).init(device)"``.
            params: the layer's weights by parameter path inside it (``{"weight": w}``),
                in the layer's own layout and dtype.
            imports: the import lines ``annotation`` and ``build`` need.
        """
        return self._translator.add_layer(hint, annotation, build, dict(params), tuple(imports),
                                          self)

    def set_constant(self, index: int, value: Any) -> None:
        """Output ``index`` is known at import time: ``value`` (array-like)."""
        array = np.asarray(value)
        try:
            dtype_of_numpy(array.dtype)
        except Exception:
            self.unsupported(f"the constant output has dtype {array.dtype}, which ember lacks")
        self.constants[index] = array

    def body(self, attr: str, bind: Sequence[str | None] | None = None,
             keep: Sequence[bool] | None = None) -> Subgraph:  # fmt: skip
        """Translates the subgraph attribute ``attr`` (``"then_branch"``, ``"body"``).

        Its nodes read this graph's values by name. ``bind`` names the local variable of
        each subgraph input (None: a fresh one); the converter assigns those variables
        before the body's lines (``Subgraph.lines``) and reads its outputs with
        ``Subgraph.output(i)`` after them. ``keep`` says which outputs are needed (None:
        all); only the nodes that those depend on are translated.
        """
        proto = self.attr(attr)
        if type(proto).__name__ != "GraphProto":
            self.unsupported(f"the attribute {attr!r} must be a graph")
        return self._translator.body(proto, bind, keep)

    def tmp(self, hint: str = "t") -> str:
        """A fresh local variable name for an intermediate result."""
        return self._translator.names.fresh(hint)

    # ------------------------------------------------------------------ errors
    def unsupported(self, reason: str) -> NoReturn:
        """Raises :class:`UnsupportedOnnxError` for this node with ``reason`` (say what is needed)."""
        raise UnsupportedOnnxError(self.name, self.op_type, self.domain, self.opset, reason)

    def __repr__(self) -> str:
        return f"NodeContext({self.name!r}, {self.op_type}, opset {self.opset})"


def literal(value: Any) -> str:
    """A Python literal for a number, a list of numbers or a small array (nested lists)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if value != value:
            return 'float("nan")'
        if value in (float("inf"), float("-inf")):
            return 'float("inf")' if value > 0 else '-float("inf")'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    return repr(value)


__all__ = ["Names", "NodeContext", "Scope", "Subgraph", "UnsupportedOnnxError", "Value",
           "literal"]  # fmt: skip
