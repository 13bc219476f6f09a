"""Chains of nodes in quantized models that import to ember's quantized ops.

A converter sees one node; two formats of onnxruntime's quantizer spread one quantized
product over several:

* QDQ (``quantize_static(..., quant_format=QuantFormat.QDQ)``): ``DequantizeLinear`` of a
  constant u8 / i8 (or u4 / i4) weight feeding ``MatMul``, ``Gemm`` or ``Conv``, the
  activation often a ``DequantizeLinear`` too. Translated node by node, the weight's DequantizeLinear folds
  into a float constant; fused, the product runs ``ember.quantization.linear`` /
  ``conv2d`` with the weight kept quantized (and the activation too, when it is one).
* dynamic (``quantize_dynamic``): ``MatMulInteger`` or ``ConvInteger`` (i32), ``Cast`` to
  f32, ``Mul`` by the scale. Fused, the i32 result never needs to be exact in f32, so the
  product takes the quantized ops whatever its size.

:func:`fuse_quantized` rewrites the graph (after shape inference, before translation):
each chain becomes one node of the domain :data:`FUSED_DOMAIN`, with the last node's
outputs, which :func:`fused_converter` translates (``ember.onnx.ops.quantize``). The
nodes it no longer reads are dead code unless something else reads them. Subgraphs (the
bodies of If, Loop, Scan) are left as they are.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, NoReturn

import numpy as np

from ember.onnx.ir import Graph, Node
from ember.onnx.ops.quantize import constant_weight, dequantized_weight, scaled_integer
from ember.onnx.registry import ConverterSpec, lookup
from ember.tensor import DType
from ember.tensor.data import dtype_of_numpy

__all__ = ["FUSED_DOMAIN", "fuse_quantized", "fused_converter"]

FUSED_DOMAIN = "ember.quantized"
"""The domain of the nodes :func:`fuse_quantized` makes (no model's own: ONNX reserves no
such domain, and a model that uses it anyway gets the usual unsupported-op error)."""

_SPECS = {
    "DequantizedWeightProduct": ConverterSpec("DequantizedWeightProduct", FUSED_DOMAIN, 1,
                                              dequantized_weight),
    "ScaledIntegerProduct": ConverterSpec("ScaledIntegerProduct", FUSED_DOMAIN, 1, scaled_integer),
}  # fmt: skip
_FLOAT = 1  # TensorProto.FLOAT, Cast's ``to``


def fused_converter(node: Node) -> ConverterSpec | None:
    """The converter of a node :func:`fuse_quantized` made, else None."""
    if node.domain != FUSED_DOMAIN:
        return None
    return _SPECS.get(node.op_type)


def fuse_quantized(graph: Graph) -> None:
    """Replaces each chain of nodes that imports to a quantized op by one fused node, in
    place (see the module doc). Models without such chains are left unchanged."""
    if FUSED_DOMAIN in graph.opsets:
        return  # the model claims the domain: leave its nodes to the usual error
    producers = {o: n for n in graph.nodes for o in n.outputs if o}
    readers: Counter[str] = Counter(info.name for info in graph.outputs)
    for node in graph.nodes:
        readers.update(i for i in node.inputs if i)
        readers.update(node.captures)
    nodes = []
    for node in graph.nodes:
        fused = (_dequantized_weight(graph, node, producers)
                 or _scaled_integer(graph, node, producers, readers))  # fmt: skip
        nodes.append(fused or node)
    graph.nodes = nodes


# ------------------------------------------------------------------ DequantizeLinear weights
def _is(node: Node | None, op_type: str) -> bool:
    return node is not None and node.op_type == op_type and node.domain == ""


def _translatable(graph: Graph, node: Node) -> bool:
    """Whether ``node``'s own converter takes it (its opset, its attributes): a fused node
    must not accept what the node alone would be refused for."""
    spec = lookup(node.op_type, node.domain, graph.opset(node.domain))
    return spec is not None and (spec.attrs is None or set(node.attrs) <= spec.attrs)


class _Hostile(Exception):
    """Parameters the fused node's converter will refuse, naming its node and input."""


def _raise(index: int, reason: str) -> NoReturn:
    raise _Hostile(reason)


def _weight_fits(graph: Graph, dq: Node) -> bool:
    """Whether ``dq`` dequantizes a constant u8 / i8 / u4 / i4 weight held by an ember layout (or
    with parameters the converter refuses with a typed error)."""
    inputs = [*dq.inputs, "", ""][:3]
    if set(dq.attrs) - {"axis", "block_size"} or not all(
            not name or name in graph.constants for name in inputs) or not inputs[1]:  # fmt: skip
        return False
    values, scale = graph.constants[inputs[0]], graph.constants[inputs[1]]
    zero = graph.constants[inputs[2]] if inputs[2] else None
    try:
        return constant_weight(values, scale, zero, int(dq.attrs.get("axis", 1)),
                               int(dq.attrs.get("block_size", 0)), _raise) is not None  # fmt: skip
    except _Hostile:
        return True


def _info(graph: Graph, name: str) -> Any:
    return graph.values.get(name)


def _activation(graph: Graph, name: str, producers: dict[str, Node]) -> list[str] | None:
    """The inputs of the DequantizeLinear making ``name`` when it dequantizes a u8 / i8
    activation with one constant f32 scale and zero point, else None."""
    dq = producers.get(name)
    if not _is(dq, "DequantizeLinear") or set(dq.attrs) - {"axis"} or not _translatable(graph, dq):
        return None
    values, scale, zero = [*dq.inputs, "", ""][:3]
    info = _info(graph, values)
    if values in graph.constants or info is None or info.dtype not in (DType.U8, DType.I8):
        return None
    for param in (scale, zero):
        if param and (param not in graph.constants or graph.constants[param].size != 1):
            return None
    if scale not in graph.constants or graph.constants[scale].dtype != np.float32:
        return None
    if zero and dtype_of_numpy(graph.constants[zero].dtype) is not info.dtype:
        return None
    return [values, scale, zero]


def _dequantized_weight(graph: Graph, node: Node, producers: dict[str, Node]) -> Node | None:
    """MatMul / Gemm / Conv of a constant DequantizeLinear weight as one fused node."""
    if node.domain != "" or node.op_type not in ("MatMul", "Gemm", "Conv") or len(node.inputs) < 2:
        return None
    x, w = node.inputs[0], node.inputs[1]
    dq = producers.get(w)
    if not x or not _is(dq, "DequantizeLinear") or not _weight_fits(graph, dq):
        return None
    if not (_translatable(graph, node) and _translatable(graph, dq)):
        return None
    rank = graph.constants[dq.inputs[0]].ndim
    info = _info(graph, x)
    if info is None or info.dtype is not DType.F32 or info.shape is None:
        return None
    x_rank = len(info.shape)
    if node.op_type == "Conv":
        auto_pad = node.attrs.get("auto_pad", "NOTSET") or "NOTSET"
        kernel = list(graph.constants[dq.inputs[0]].shape[2:])
        if (rank != 4 or x_rank != 4 or list(node.attrs.get("kernel_shape", kernel)) != kernel
                or auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")
                or (auto_pad.startswith("SAME") and info.static_shape is None)):  # fmt: skip
            return None
    elif rank != 2 or x_rank < 2 or (node.op_type == "Gemm" and x_rank != 2):
        return None
    activation = None if node.attrs.get("transA", 0) else _activation(graph, x, producers)
    extra = node.inputs[2] if len(node.inputs) > 2 else ""
    weight = [*dq.inputs, "", ""][:3]
    inputs = ["" if activation else x, *weight, *(activation or ["", "", ""]), extra]
    attrs = {**node.attrs, "op": node.op_type, "weight_node": dq.label,
             "weight_axis": int(dq.attrs.get("axis", 1)),
             "weight_block": int(dq.attrs.get("block_size", 0))}  # fmt: skip
    return Node(node.label, "DequantizedWeightProduct", FUSED_DOMAIN, inputs, list(node.outputs),
                attrs, node.index)  # fmt: skip


# ------------------------------------------------------------------ scaled integer products
def _scaled_integer(graph: Graph, node: Node, producers: dict[str, Node],
                    readers: Counter[str]) -> Node | None:  # fmt: skip
    """``Mul(Cast<f32>(MatMulInteger | ConvInteger), scale)`` as one fused node, where the
    integer op has a constant weight and nothing else reads its or the Cast's output."""
    if not _is(node, "Mul") or len(node.inputs) != 2:
        return None
    for side in (0, 1):
        cast = producers.get(node.inputs[side])
        if not _is(cast, "Cast") or cast.attrs.get("to") != _FLOAT or readers[cast.outputs[0]] != 1:
            continue
        product = producers.get(cast.inputs[0])
        if not (_is(product, "MatMulInteger") or _is(product, "ConvInteger")):
            continue
        if readers[product.outputs[0]] != 1 or product.inputs[1] not in graph.constants:
            continue
        if not all(_translatable(graph, n) for n in (node, cast, product)):
            continue
        inputs = [*product.inputs, "", ""][:4] + [node.inputs[1 - side]]
        attrs = {**product.attrs, "op": product.op_type}
        return Node(product.label, "ScaledIntegerProduct", FUSED_DOMAIN, inputs,
                    list(node.outputs), attrs, node.index)  # fmt: skip
    return None
