"""Graph to program: runs each node's converter, folding what is known at import time.

The translator walks the nodes that the outputs depend on, in order. A node whose
inputs are all constants is folded: its converter's lines run right away on ember's
NdArray backend and its outputs become constants. Every other node's lines go into the
generated ``forward``. Constants that runtime code reads become module fields.

A node with subgraphs (If, Loop, Scan) has its converter translate each body with a
child translator (:meth:`Translator.body`): the body's lines become a block of Python
control flow inside ``forward``, and its nodes read outer values by their names, as
ONNX scoping allows. Parent and child share the module's fields and local names.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ember.backend.environment import switch
from ember.onnx import host
from ember.onnx.context import NodeContext, literal
from ember.onnx.infer import infer
from ember.onnx.ir import Graph, Node, ValueInfo, onnx_type_name
from ember.onnx.quant_patterns import fuse_quantized, fused_converter
from ember.onnx.registry import OnnxImportError, UnsupportedOnnxError, lookup, missing_reason
from ember.onnx.vocabulary import (
    Field,
    check_field,
    check_lines,
    imported_names,
    instantiate,
    reserved_names,
    runtime_globals,
)
from ember.tensor import DType, Tensor
from ember.tensor.data import dtype_of_numpy

# Names a value never takes: keywords, builtins, the generated module's own names and
# ``Module``'s attributes (see :func:`ember.onnx.vocabulary.reserved_names`).
RESERVED = reserved_names()

# The longest identifier made from a name; a longer name is cut (the dedup keeps it unique).
_MAX_NAME = 64

# Inputs that converters read as ints (``rt.ints``): a host value goes there as it is.
_INT_READERS = {"Reshape": (1,), "Slice": (1, 2, 3, 4), "Expand": (1,)}


class Namer:
    """Turns ONNX value names into unique Python identifiers (``"/conv1/Conv_output_0"`` to
    ``conv1_conv_output_0``).

    A made name is lower-case ASCII letters, digits and underscores (never two in a row),
    never starts with an underscore or a digit, is at most about 64 characters, and is
    never a keyword, a builtin or a reserved name: nothing of the model's text survives in
    it but letters and digits.
    """

    def __init__(self, reserved: frozenset[str] | set[str] = RESERVED) -> None:
        self.reserved = frozenset(reserved)
        self.used: set[str] = set(reserved)
        self.made: set[str] = set()

    @staticmethod
    def sanitize(text: str) -> str:
        name = re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_").lower()[:_MAX_NAME].rstrip("_")
        if not name:
            name = "v"
        if name[0].isdigit():
            name = f"v{name}"
        return name

    def fresh(self, hint: str) -> str:
        base = self.sanitize(hint)
        if base in self.reserved:
            base += "_"  # ``input_``, ``class_``: as PEP 8 suggests
        name, n = base, 1
        while name in self.used:
            name = f"{base.rstrip('_')}_{n}"
            n += 1
        self.used.add(name)
        self.made.add(name)
        return name


@dataclass
class Program:
    """What the translator produced, for codegen to write out."""

    graph: Graph
    inputs: list[tuple[str, ValueInfo]]
    outputs: list[tuple[str, ValueInfo]]
    fields: list[Field] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def _fold_device() -> Any:
    import ember

    return ember.device("ndarray")


class Translator:
    """Translates one :class:`Graph` into a :class:`Program` (see :meth:`translate`).

    A child translator (``parent`` given) translates a subgraph: it sees the values of its
    enclosing graphs and declares fields and local names in the parent's program.
    """

    def __init__(self, graph: Graph, parent: Translator | None = None) -> None:
        self.graph = graph
        self.parent = parent
        self.lines: list[str] = []
        self.vars: dict[str, str] = {}
        self.consts: dict[str, np.ndarray] = dict(graph.constants)
        trainable = {k for k, v in graph.constants.items() if v.dtype.kind == "f"}
        if parent is None:
            self.names = Namer()
            self.fields: list[Field] = []
            self.field_names: set[str] = set()
            self.imported: set[str] = set()  # what the fields' imports bring (``LstmState``)
            self.trainable = trainable
            self._const_exprs: dict[str, str] = {}
            # A tensor of the model's (its first input): where host values go to the device.
            self._like: str | None = None
            self._host_on = switch("EMBER_ONNX_HOST", True)
        else:
            self.names, self.fields = parent.names, parent.fields
            self.field_names, self.imported = parent.field_names, parent.imported
            self.trainable = parent.trainable
            self.trainable.update(trainable)
            self._const_exprs = parent._const_exprs
            self._like, self._host_on = parent._like, parent._host_on
        # This graph's host values (module ``host``) by ONNX name, each with the most
        # elements it can hold; ``vars`` names them.
        self.host: dict[str, int] = {}
        # What this graph itself defines; any other name is an enclosing graph's value.
        self._defined = {i.name for i in graph.inputs} | set(graph.constants) | {
            o for n in graph.nodes for o in n.outputs if o}
        self._used: set[str] = set()
        self._keep: Sequence[bool] | None = None
        self._fold_env: dict[str, Any] | None = None
        self._fold_count = 0

    # ------------------------------------------------------------------ queries for converters
    def const_value(self, name: str) -> np.ndarray | None:
        if name in self.consts:
            return self.consts[name]
        if self.parent is None or name in self._defined:
            return None
        return self.parent.const_value(name)

    def info_of(self, name: str) -> ValueInfo | None:
        """What shape inference knows of ``name``, here or in an enclosing graph."""
        if self.parent is not None and name not in self._defined:
            return self.parent.info_of(name)
        return self.graph.values.get(name)

    def shape_of(self, name: str) -> tuple[Any, ...] | None:
        const = self.const_value(name)
        if const is not None:
            return tuple(const.shape)
        info = self.info_of(name)
        return info.shape if info is not None else None

    def dtype_of(self, name: str) -> DType | None:
        const = self.const_value(name)
        if const is not None:
            return dtype_of_numpy(const.dtype)
        info = self.info_of(name)
        return info.dtype if info is not None else None

    def is_used(self, name: str) -> bool:
        return bool(name) and name in self._used

    def expr_of(self, name: str, node: NodeContext | None) -> str:
        if node is not None and node.folding:
            const = self.const_value(name)
            if const is not None:
                return self._bind(Tensor.from_data(const, _fold_device()))
        if name in self.host:
            if node is not None and _reads_ints(node, name):
                return self.vars[name]
            return f"rt.to_device({self.vars[name]}, {self._like})"
        if name in self.vars:
            return self.vars[name]
        if name in self.consts:
            if name not in self._const_exprs:
                trainable = name in self.trainable
                self._const_exprs[name] = self.add_param(self.consts[name], name, trainable, None)
            return self._const_exprs[name]
        if self.parent is not None:
            return self.parent.expr_of(name, None)
        raise OnnxImportError(f"ONNX import: the value {name!r} is used before any node makes it")

    # ------------------------------------------------------------------ declarations
    def _bind(self, value: Any) -> str:
        assert self._fold_env is not None
        self._fold_count += 1
        name = f"_fold_{self._fold_count}"
        self._fold_env[name] = value
        return name

    def add_param(self, value: np.ndarray, hint: str, trainable: bool | None,
                  node: NodeContext | None) -> str:  # fmt: skip
        if node is not None and node.folding:
            return self._bind(Tensor.from_data(value, _fold_device()))
        if trainable is None:
            trainable = value.dtype.kind == "f"
        name = self.names.fresh(hint)
        dtype = dtype_of_numpy(value.dtype)
        frozen = "" if trainable and dtype.is_float else ", trainable=False"
        build = f"rt.param({list(value.shape)}, {dtype.value!r}, device{frozen})"
        self.fields.append(Field(name, "Param", build, {"": value}))
        self.field_names.add(name)
        return f"self.{name}.val()"

    def add_layer(self, hint: str, annotation: str, build: str, params: dict[str, np.ndarray],
                  imports: tuple[str, ...], node: NodeContext) -> str:  # fmt: skip
        if node.folding:
            layer = instantiate(Field(hint, annotation, build, params, imports), _fold_device())
            return self._bind(layer)
        name = self.names.fresh(hint)
        item = Field(name, annotation, build, params, imports)
        check_field(item, _where(node))
        self.imported.update(imported_names(item))
        self.fields.append(item)
        self.field_names.add(name)
        return f"self.{name}"

    # ------------------------------------------------------------------ the walk
    def translate(self) -> Program:
        graph = self.graph
        inputs = []
        for info in graph.inputs:
            if info.dtype is None:
                raise OnnxImportError(
                    f"ONNX import: graph input {info.name!r} has type "
                    f"{onnx_type_name(info.elem_type) if info.elem_type > 0 else 'non-tensor'}"
                    ", which ember has no tensor dtype for"
                )
            var = self.names.fresh(info.name)
            self.vars[info.name] = var
            inputs.append((var, info))
        if inputs and self.parent is None:
            self._like = inputs[0][0]
        for node in self._live_nodes():
            self._convert(node)
        outputs = []
        for info in graph.outputs:
            outputs.append((self.expr_of(info.name, None), info))
        return Program(graph, inputs, outputs, self.fields, self.lines)

    def _live_nodes(self) -> list[Node]:
        """The nodes the graph's outputs depend on, in order; the others are dead code.
        A node with subgraphs also depends on the outer values they read."""
        needed = {info.name for i, info in enumerate(self.graph.outputs)
                  if self._keep is None or self._keep[i]}
        self._used = set(needed)
        live = []
        for node in reversed(self.graph.nodes):
            if any(o in needed for o in node.outputs):
                live.append(node)
                reads = [i for i in node.inputs if i] + sorted(node.captures)
                needed.update(reads)
                self._used.update(reads)
        return live[::-1]

    def body(self, proto: Any, bind: Sequence[str | None] | None = None,
             keep: Sequence[bool] | None = None) -> Body:  # fmt: skip
        """Translates the subgraph ``proto`` (the body of an If, Loop or Scan).

        Args:
            proto: the ``GraphProto``.
            bind: per subgraph input, the local variable to hold it, or None for a fresh
                one; the converter assigns these variables before the body's lines run.
            keep: per subgraph output, whether it is needed (None: all are); the nodes
                only unneeded outputs depend on are left out.

        Returns:
            the :class:`Body`: its input variables, lines and outputs.
        """
        graph = self.graph.body(proto)
        child = Translator(graph, parent=self)
        child._keep = keep
        variables = []
        for i, info in enumerate(graph.inputs):
            wanted = bind[i] if bind is not None and i < len(bind) else None
            var = wanted or self.names.fresh(info.name)
            child.vars[info.name] = var
            variables.append(var)
        for inner in child._live_nodes():
            child._convert(inner)
        return Body(child, variables)

    def _convert(self, node: Node) -> None:
        opset = self.graph.opset(node.domain)
        spec = lookup(node.op_type, node.domain, opset) or fused_converter(node)
        if spec is None:
            raise UnsupportedOnnxError(node.label, node.op_type, node.domain, opset,
                                       missing_reason(node.op_type, node.domain, opset))
        if spec.attrs is not None:
            extra = sorted(set(node.attrs) - spec.attrs)
            if extra:
                known = ", ".join(sorted(spec.attrs)) or "none"
                raise UnsupportedOnnxError(
                    node.label, node.op_type, node.domain, opset,
                    f"attribute {', '.join(map(repr, extra))} is not supported "
                    f"(supported attributes: {known}); a converter handling it is needed",
                )
        for name in node.inputs:
            info = self.info_of(name) if name else None
            if name and self.const_value(name) is None and info is not None \
                    and info.elem_type and info.dtype is None:
                what = "is a sequence, map or optional value, not a tensor" \
                    if info.elem_type < 0 else \
                    f"has type {onnx_type_name(info.elem_type)}, which ember has no tensor dtype for"
                raise UnsupportedOnnxError(node.label, node.op_type, node.domain, opset,
                                           f"input {name!r} {what}")
        folding = (spec.foldable and not node.has_subgraph
                   and all(not i or self.const_value(i) is not None for i in node.inputs))
        if folding:
            self._fold(node, spec, opset)
            return
        bound = self._on_host(node)
        if bound is not None:
            self._convert_host(node, opset, bound)
            return
        outputs = [self.names.fresh(o or f"{node.op_type}_unused") for o in node.outputs]
        ctx = NodeContext(self, node, spec, opset, outputs, folding=False)
        try:
            lines = _as_lines(spec.fn(ctx))
        except OnnxImportError:  # UnsupportedOnnxError too
            raise
        except Exception as error:  # a model the converter did not foresee: still typed
            raise OnnxImportError(f"ONNX import: {_where(ctx)}: the converter failed on this "
                                  f"node: {type(error).__name__}: {error}") from error
        check_lines(lines, _where(ctx), lambda n: n in self.names.made or n in self.imported,
                    self.field_names.__contains__)  # fmt: skip
        self.lines.extend(lines)
        for i, (onnx_name, var) in enumerate(zip(node.outputs, outputs)):
            if i in ctx.constants:
                self.consts[onnx_name] = ctx.constants[i]
            elif onnx_name:
                self.vars[onnx_name] = var

    def _on_host(self, node: Node) -> int | None:
        """Whether ``node`` is shape arithmetic to run on host values (module ``host``): the
        most elements its output holds, or None when it runs as tensor ops. Its inputs are
        host values or small constants (a ``Shape`` or ``Size`` reads any tensor whose dims
        are not all known), at least one a host value, and its output is known to hold at
        most ``host.MAX_ELEMENTS`` elements."""
        if not self._host_on or self._like is None or node.domain or node.has_subgraph \
                or len(node.outputs) != 1:
            return None
        reads_shape = node.op_type in ("Shape", "Size")
        dtypes: list[np.dtype | None] = []
        sizes: list[int] = []
        for i, name in enumerate(node.inputs):
            const = self.const_value(name) if name else None
            if not name:
                sizes.append(0)
            elif name in self.host:
                dtypes.append(None)
                sizes.append(self.host[name])
            elif reads_shape and i == 0:
                shape = self.shape_of(name)
                if shape is None or all(isinstance(d, int) for d in shape):
                    return None  # known dims: the converter folds them
                dtypes.append(None)
                sizes.append(len(shape))
            elif const is None or const.size > host.MAX_ELEMENTS or const.ndim > 1 \
                    or const.dtype not in host.DTYPES:
                return None
            else:
                dtypes.append(const.dtype)
                sizes.append(const.size)
        if not reads_shape and not any(n in self.host for n in node.inputs if n):
            return None
        if not host.runs_on_host(node.op_type, dict(node.attrs), dtypes):
            return None
        shape = self.shape_of(node.outputs[0]) if node.outputs[0] else None
        if shape is not None and all(isinstance(d, int) for d in shape):
            bound = math.prod(shape)
        else:
            bound = host.size_bound(node.op_type, sizes)
        return bound if bound <= host.MAX_ELEMENTS else None

    def _convert_host(self, node: Node, opset: int, bound: int) -> None:
        outputs = [self.names.fresh(o or f"{node.op_type}_unused") for o in node.outputs]
        args = []
        for name in node.inputs:
            const = self.const_value(name) if name else None
            if not name:
                args.append("None")
            elif name in self.host:
                args.append(self.vars[name])
            elif const is not None:
                args.append(f"host.array({literal(const)}, {const.dtype.name!r})")
            else:  # the tensor a Shape or Size reads
                args.append(self.expr_of(name, None))
        attrs = ", ".join(f"{k!r}: {literal(v)}" for k, v in sorted(node.attrs.items()))
        line = (f"{outputs[0]} = host.run({node.op_type!r}, {opset}, [{', '.join(args)}], "
                f"{{{attrs}}})")  # fmt: skip
        check_lines([line], f"node {node.label!r} ({node.op_type})",
                    lambda n: n in self.names.made, self.field_names.__contains__)  # fmt: skip
        self.lines.append(line)
        for onnx_name, var in zip(node.outputs, outputs):
            if onnx_name:
                self.vars[onnx_name] = var
                self.host[onnx_name] = bound

    def _fold(self, node: Node, spec: Any, opset: int) -> None:
        self._fold_env = {}
        outputs = [f"_out_{i}" for i in range(len(node.outputs))]
        ctx = NodeContext(self, node, spec, opset, outputs, folding=True)
        try:
            lines = _as_lines(spec.fn(ctx))
            env = {**runtime_globals(), **self._fold_env}
            bound = {*self._fold_env, *outputs}
            check_lines(lines, _where(ctx), lambda n: n in bound or n in self.names.made,
                        lambda _: False)  # fmt: skip
            if lines:
                exec(compile("\n".join(lines), f"<fold {node.label!r}>", "exec"), env)
        except OnnxImportError:  # UnsupportedOnnxError too
            raise
        except Exception as error:
            raise OnnxImportError(
                f"ONNX import: node {node.label!r} ({node.op_type}) failed when evaluated at "
                f"import time on constant inputs: {type(error).__name__}: {error}"
            ) from error
        finally:
            self._fold_env = None
        from_trainable = any(i in self.trainable for i in node.inputs if i)
        for i, onnx_name in enumerate(node.outputs):
            if not onnx_name:
                continue
            if i in ctx.constants:
                value = ctx.constants[i]
            elif outputs[i] in env:
                value = _to_numpy(env[outputs[i]])
            else:
                raise OnnxImportError(f"ONNX import: the converter of {node.op_type} did not "
                                      f"assign output {i} of node {node.label!r}")
            self.consts[onnx_name] = value
            if from_trainable and value.dtype.kind == "f":
                self.trainable.add(onnx_name)


class Body:
    """A subgraph translated for its node's converter.

    Attributes:
        inputs: the local variable of each subgraph input (the converter assigns them).
        lines: the body's code; it reads ``inputs`` and outer values.
    """

    def __init__(self, translator: Translator, inputs: list[str]) -> None:
        self._translator = translator
        self.inputs = inputs
        self.lines = translator.lines
        self._outputs = [info.name for info in translator.graph.outputs]

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def output(self, index: int) -> str:
        """The expression of output ``index`` after the body's lines (a constant becomes a
        module field)."""
        return self._translator.expr_of(self._outputs[index], None)

    def output_const(self, index: int) -> np.ndarray | None:
        """Output ``index`` when it is known at import time, else None."""
        return self._translator.const_value(self._outputs[index])

    def output_trainable(self, index: int) -> bool:
        """Whether output ``index`` is (or is computed from constants only out of) trainable
        weights, which should stay module parameters rather than fixed constants."""
        return self._outputs[index] in self._translator.trainable

    def output_shape(self, index: int) -> tuple[Any, ...] | None:
        return self._translator.shape_of(self._outputs[index])

    def output_dtype(self, index: int) -> DType | None:
        return self._translator.dtype_of(self._outputs[index])

    def input_used(self, index: int) -> bool:
        """Whether the body reads input ``index`` (a loop's counter often is not)."""
        name = self._translator.graph.inputs[index].name
        return self._translator.is_used(name)


def _reads_ints(node: NodeContext, name: str) -> bool:
    """Whether ``node`` reads its input ``name`` as ints only (``rt.ints``): at an input
    that takes ints, and at no other (``Reshape(s, s)`` reads ``s`` as a tensor too)."""
    positions = _INT_READERS.get(node.op_type, ()) if not node.domain else ()
    at = {i for i in range(node.num_inputs) if node.input(i).name == name}
    return bool(at) and at <= set(positions)


def _where(node: NodeContext) -> str:
    return f"node {node.name!r} ({node.op_type})"


def _as_lines(result: Any) -> list[str]:
    if result is None:
        return []
    if isinstance(result, str):
        return result.splitlines()
    return [line for chunk in result for line in chunk.splitlines()]


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, Tensor):
        return np.array(value.into_data().to_numpy())
    return np.asarray(value)


def translate(graph: Graph) -> Program:
    """The program of ``graph``; raises :class:`UnsupportedOnnxError` for a node it cannot
    translate. Ranks ONNX's inference left unknown are inferred first (:mod:`ember.onnx.infer`),
    then chains of quantized nodes fused (:mod:`ember.onnx.quant_patterns`)."""
    infer(graph)
    fuse_quantized(graph)
    return Translator(graph).translate()
