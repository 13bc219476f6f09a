"""The importer's view of an ONNX model: a graph of nodes over named values.

:func:`parse` reads a ``ModelProto`` (or a file) into a :class:`Graph`: the opsets it
imports, its inputs and outputs with static and dynamic dims, its nodes with parsed
attributes, and its constants. Weights stored as initializers become constants here;
``Constant`` nodes stay nodes and become constants when the translator folds them.
Shapes and dtypes of intermediate values come from ONNX shape inference, when it can
tell them.

Every string here (names, dims, attributes, the producer) is the model's text, which
may be hostile: later stages turn it into identifiers of their own or ``repr`` literals,
never into code. An attribute must have the type its op's schema declares, so that a
number a converter writes out is a number, not a string in disguise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ember.backend.errors import BackendUnavailableError
from ember.onnx.registry import OnnxFileNotFoundError, OnnxImportError, canonical_domain
from ember.tensor import DType

Dim = int | str | None
"""A dim: its size, the name of a dynamic dim (``"batch"``), or None when unknown."""


def require_onnx() -> Any:
    """The ``onnx`` package, or an error saying how to install it."""
    try:
        import onnx
    except ImportError:
        raise BackendUnavailableError(
            "ONNX import needs the onnx package: pip install 'ember[onnx]' "
            "(or pip install onnx==1.22.0)"
        ) from None
    return onnx


# ONNX TensorProto element types ember has a dtype for.
_DTYPES = {
    1: DType.F32, 2: DType.U8, 3: DType.I8, 4: DType.U16, 5: DType.I16, 6: DType.I32,
    7: DType.I64, 9: DType.BOOL, 10: DType.F16, 11: DType.F64, 12: DType.U32, 13: DType.U64,
    16: DType.BF16, 17: DType.F8E4M3FN, 18: DType.F8E4M3FNUZ, 19: DType.F8E5M2,
    20: DType.F8E5M2FNUZ, 21: DType.U4, 22: DType.I4, 23: DType.F4E2M1FN, 24: DType.F8E8M0FNU,
    25: DType.U2, 26: DType.I2,
}  # fmt: skip


def ember_dtype(elem_type: int) -> DType | None:
    """The ember dtype of an ONNX element type, or None when ember has none (strings, complex...)."""
    return _DTYPES.get(elem_type)


def onnx_type_name(elem_type: int) -> str:
    onnx = require_onnx()
    try:
        return onnx.TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"type {elem_type}"


@dataclass
class ValueInfo:
    """What is known about a value before running the model.

    Args:
        name: the ONNX value name.
        elem_type: the ONNX element type (0 when unknown).
        shape: one :data:`Dim` per axis, or None when even the rank is unknown.
    """

    name: str
    elem_type: int = 0
    shape: tuple[Dim, ...] | None = None

    @property
    def dtype(self) -> DType | None:
        return ember_dtype(self.elem_type)

    @property
    def static_shape(self) -> tuple[int, ...] | None:
        """The shape when every dim is a known size, else None."""
        if self.shape is None or not all(isinstance(d, int) for d in self.shape):
            return None
        return self.shape  # type: ignore[return-value]


@dataclass
class Node:
    """One ONNX node with its attributes parsed to Python values.

    Attributes hold ints, floats, strings, NumPy arrays (tensors), lists of those, and
    ``GraphProto`` objects for subgraphs. An absent optional input is the name ``""``.
    """

    name: str
    op_type: str
    domain: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]
    index: int

    @property
    def label(self) -> str:
        """The node's name, or a made-up one (``Add_3``) when the model gives none."""
        return self.name or f"{self.op_type}_{self.index}"

    @property
    def has_subgraph(self) -> bool:
        return bool(self.subgraphs)

    @cached_property
    def subgraphs(self) -> list[Any]:
        """The ``GraphProto`` attributes (bodies of If, Loop, Scan), in attribute order."""
        onnx = require_onnx()
        found = []
        for value in self.attrs.values():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, onnx.GraphProto):
                    found.append(item)
        return found

    @cached_property
    def captures(self) -> frozenset[str]:
        """The outer values its subgraphs read by name (ONNX's implicit inputs)."""
        return frozenset().union(*(outer_names(g) for g in self.subgraphs))


@dataclass
class Graph:
    """A parsed model.

    Args:
        name: the graph's name.
        opsets: opset version per domain (``""`` is the default ONNX domain).
        inputs: the values the caller feeds, in order (initializers are weights, even
            where an old model lists them as inputs too).
        outputs: the values the model returns, in order.
        nodes: the nodes in topological order.
        constants: initializers by name, as NumPy arrays.
        values: every value info known, inputs and outputs included.
        producer: the tool that wrote the model.
        bodies: subgraphs parsed ahead, with their value infos completed (see :meth:`body`).
    """

    name: str
    opsets: dict[str, int]
    inputs: list[ValueInfo]
    outputs: list[ValueInfo]
    nodes: list[Node]
    constants: dict[str, np.ndarray]
    values: dict[str, ValueInfo] = field(default_factory=dict)
    producer: str = ""
    bodies: dict[int, tuple[Any, Graph]] = field(default_factory=dict)

    def opset(self, domain: str) -> int:
        return self.opsets.get(canonical_domain(domain), 0)

    def body(self, proto: Any) -> Graph:
        """The :class:`Graph` of ``proto``, a subgraph of one of this graph's nodes: the
        one ember's shape inference completed (kept in ``bodies`` by the proto's id), else
        parsed now."""
        found = self.bodies.get(id(proto))
        if found is not None and found[0] is proto:
            return found[1]
        return graph_of(proto, self.opsets)


def load(source: Any) -> Any:
    """A ``ModelProto`` from a path, bytes or a ``ModelProto`` (returned as is)."""
    onnx = require_onnx()
    if isinstance(source, onnx.ModelProto):
        return source
    if isinstance(source, bytes | bytearray):
        return onnx.load_from_string(bytes(source))
    path = Path(source)
    if not path.is_file():
        raise OnnxFileNotFoundError(f"ONNX import: no model file at {path}")
    try:
        return onnx.load(str(path))
    except Exception as error:  # protobuf raises its own DecodeError types
        raise OnnxImportError(f"ONNX import: {path} is not an ONNX model ({error})") from None


def check_text(message: Any, path: str = "model") -> None:
    """Raises :class:`OnnxImportError` for a text field of ``message`` (a name, a doc string,
    a dim's name...) that is not valid UTF-8, naming the field: protobuf hands such a field
    over as bytes rather than text."""
    from google.protobuf.descriptor import FieldDescriptor

    for descriptor, value in message.ListFields():
        repeated = descriptor.is_repeated if hasattr(descriptor, "is_repeated") \
            else descriptor.label == FieldDescriptor.LABEL_REPEATED
        if descriptor.type == FieldDescriptor.TYPE_STRING:
            for i, item in enumerate(value if repeated else [value]):
                if not isinstance(item, str):
                    where = f"{path}.{descriptor.name}" + (f"[{i}]" if repeated else "")
                    raise OnnxImportError(f"ONNX import: {where} is not valid UTF-8 text: "
                                          f"{bytes(item)[:200]!r}")
        elif descriptor.type == FieldDescriptor.TYPE_MESSAGE:
            if descriptor.message_type.GetOptions().map_entry:
                continue
            items = value if repeated else [value]
            for i, item in enumerate(items):
                check_text(item, f"{path}.{descriptor.name}" + (f"[{i}]" if repeated else ""))


def _dims(type_proto: Any) -> tuple[Dim, ...] | None:
    tensor = type_proto.tensor_type
    if not tensor.HasField("shape"):
        return None
    dims: list[Dim] = []
    for d in tensor.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return tuple(dims)


def _value_info(proto: Any) -> ValueInfo:
    if proto.type.WhichOneof("value") is None:
        return ValueInfo(proto.name)  # untyped (a subgraph input may leave its type out)
    if not proto.type.HasField("tensor_type"):
        # A sequence, map or optional: no tensor dtype; converters reject such inputs.
        return ValueInfo(proto.name, -1, None)
    return ValueInfo(proto.name, proto.type.tensor_type.elem_type, _dims(proto.type))


def to_array(tensor: Any) -> np.ndarray:
    """A ``TensorProto`` as a NumPy array (external data must already be loaded).

    Raises:
        OnnxImportError: data that does not make the array its dims and type declare.
    """
    from onnx import numpy_helper

    try:
        return np.asarray(numpy_helper.to_array(tensor))
    except Exception as error:  # onnx raises ValueError, TypeError... on malformed data
        raise OnnxImportError(f"ONNX import: tensor {tensor.name!r} is malformed: "
                              f"{type(error).__name__}: {error}") from None


def _short_float(value: float) -> float:
    """An attribute float (stored as f32) as the shortest decimal of that f32: 0.35, not
    0.3499999940395355, so generated code reads well and means the same f32."""
    return float(str(np.float32(value)))


def _attr_value(attr: Any) -> Any:
    from onnx import AttributeProto, helper

    try:
        value = helper.get_attribute_value(attr)
    except Exception as error:  # an attribute of no type, or a type onnx does not know
        raise OnnxImportError(f"ONNX import: attribute {attr.name!r} has no value of a known "
                              f"type ({error.__class__.__name__})") from None
    if attr.type == AttributeProto.FLOAT:
        return _short_float(value)
    if attr.type == AttributeProto.FLOATS:
        return [_short_float(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list):
        return [v.decode("utf-8", errors="replace") if isinstance(v, bytes)
                else to_array(v) if type(v).__name__ == "TensorProto" else v for v in value]
    if type(value).__name__ == "TensorProto":
        return to_array(value)
    return value


@dataclass(frozen=True)
class _Schema:
    """What the importer checks of a node against its op's schema."""

    attr_types: dict[str, int]
    required_inputs: tuple[int, ...]


@cache
def _schema(op_type: str, domain: str, opset: int) -> _Schema | None:
    """The op's schema at ``opset``, or None for an op (or opset) onnx has none for."""
    onnx = require_onnx()
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:  # no schema: the converter's own checks are all there is
        return None
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    return _Schema({name: int(a.type) for name, a in schema.attributes.items()},
                   tuple(i for i, p in enumerate(schema.inputs) if p.option == single))


def _check_node(node: Any, domain: str, opsets: dict[str, int]) -> None:
    """Raises :class:`OnnxImportError` for an attribute whose type is not the one the op's
    schema declares (a string where a float belongs) or a required input left out, as
    onnxruntime refuses them."""
    schema = _schema(node.op_type, domain, opsets.get(domain, 0))
    if schema is None:
        return
    onnx = require_onnx()
    kinds = onnx.AttributeProto.AttributeType
    label = node.name or node.op_type
    for attr in node.attribute:
        want = schema.attr_types.get(attr.name)
        if want is not None and want != onnx.AttributeProto.UNDEFINED and attr.type != want:
            got = kinds.Name(attr.type) if attr.type in kinds.values() else str(attr.type)
            raise OnnxImportError(
                f"ONNX import: node {label!r} ({node.op_type!r}): attribute {attr.name!r} has "
                f"type {got}, its schema says {kinds.Name(want)}")
    for i in schema.required_inputs:
        if i >= len(node.input) or not node.input[i]:
            raise OnnxImportError(f"ONNX import: node {label!r} ({node.op_type!r}): required "
                                  f"input {i} is missing (an empty name)")


def _check_definitions(proto: Any) -> None:
    """Raises :class:`OnnxImportError` for a graph input, output or initializer with an
    empty name, or a value defined twice (ONNX values are assigned once)."""
    where = f"graph {proto.name!r}"
    for kind, items in (("input", proto.input), ("output", proto.output),
                        ("initializer", proto.initializer)):  # fmt: skip
        for i, item in enumerate(items):
            if not item.name:
                raise OnnxImportError(f"ONNX import: {where}: {kind} {i} has an empty name")
    defined: dict[str, str] = {}

    def define(name: str, what: str) -> None:
        if name in defined:
            raise OnnxImportError(f"ONNX import: {where}: the value {name!r} is defined twice "
                                  f"({defined[name]} and {what})")
        defined[name] = what

    initializers = set()
    for i, tensor in enumerate(proto.initializer):
        define(tensor.name, f"initializer {i}")
        initializers.add(tensor.name)
    for i, info in enumerate(proto.input):
        if info.name not in initializers:  # IR < 4 lists initializers as inputs too
            define(info.name, f"input {i}")
    for node in proto.node:
        for k, name in enumerate(node.output):
            if name:
                define(name, f"output {k} of node {node.name or node.op_type!r}")


def infer_shapes(model: Any) -> Any:
    """The model with ONNX's shape inference applied; the model as is if inference fails."""
    onnx = require_onnx()
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # inference is a help, not a requirement: converters cope without it
        return model


def outer_names(proto: Any) -> frozenset[str]:
    """The names a ``GraphProto`` reads from enclosing graphs: what its nodes (and their
    own subgraphs) use or it returns, less what it defines."""
    onnx = require_onnx()
    defined = {p.name for p in proto.input} | {t.name for t in proto.initializer}
    used = {p.name for p in proto.output}
    for node in proto.node:
        used.update(node.input)
        for attr in node.attribute:
            graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else \
                list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else []
            for graph in graphs:
                used.update(outer_names(graph))
        defined.update(node.output)
    return frozenset(used - defined - {""})


def graph_of(proto: Any, opsets: dict[str, int], producer: str = "") -> Graph:
    """A :class:`Graph` of a ``GraphProto``: a model's main graph, or a subgraph (the body
    of an If, Loop or Scan), which takes its model's ``opsets``."""
    _check_definitions(proto)
    constants = {t.name: to_array(t) for t in proto.initializer}
    values: dict[str, ValueInfo] = {}
    for info in [*proto.value_info, *proto.input, *proto.output]:
        values[info.name] = _value_info(info)
    for name, array in constants.items():
        values.setdefault(name, ValueInfo(name, 0, tuple(array.shape)))
    # Models of IR version < 4 list every initializer as a graph input too; like onnxruntime,
    # ember takes those as weights, not as values the caller feeds.
    inputs = [values[p.name] for p in proto.input if p.name not in constants]
    outputs = [values[p.name] for p in proto.output]
    nodes = []
    for i, n in enumerate(proto.node):
        domain = canonical_domain(n.domain)
        _check_node(n, domain, opsets)
        nodes.append(Node(n.name, n.op_type, domain, list(n.input), list(n.output),
                          {a.name: _attr_value(a) for a in n.attribute}, i))
    return Graph(proto.name, dict(opsets), inputs, outputs, nodes, constants, values, producer)


def parse(source: Any) -> Graph:
    """Reads a model (a path, bytes or ``ModelProto``) into a :class:`Graph`.

    Raises:
        OnnxFileNotFoundError: no file at the path.
        OnnxImportError: the bytes are not an ONNX model.
    """
    model = load(source)
    check_text(model)
    model = infer_shapes(model)
    opsets: dict[str, int] = {}
    for entry in model.opset_import:
        domain = canonical_domain(entry.domain)
        if domain in opsets:
            raise OnnxImportError(f"ONNX import: the model's opset_import lists the domain "
                                  f"{entry.domain!r} twice")
        opsets[domain] = int(entry.version)
    if "" not in opsets:
        # IR version 2 models predate opset_import; they are opset 1.
        opsets[""] = 1
    producer = " ".join(p for p in (model.producer_name, model.producer_version) if p)
    return graph_of(model.graph, opsets, producer)
