"""From a trace to an ONNX model: name the values, translate each op that reaches an
output through its exporter, and describe the inputs and outputs (dynamic dims by name)."""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import helper

from ember.onnx.export.emitter import Emitter, onnx_type
from ember.onnx.export.errors import ExportError, UnsupportedExportError
from ember.onnx.export.registry import module_rule_for, rule_for, why_no_form
from ember.onnx.export.symbolic import DynamicDim
from ember.onnx.export.tracer import OpCall, Trace


def live_calls(trace: Trace) -> list[OpCall]:
    """The calls whose outputs reach a graph output, in order (a forward may compute values
    it never uses: those ops need no ONNX form)."""
    producer = {id(h): call for call in trace.calls for h in call.outputs}
    needed = {id(h) for h in trace.outputs}
    live: set[int] = set()
    for call in reversed(trace.calls):
        if any(id(h) in needed for h in call.outputs):
            live.add(call.index)
            needed.update(id(h) for h in call.inputs if h is not None and id(h) in producer)
    return [call for call in trace.calls if call.index in live]


def _dims(shape: Sequence[int], other: Sequence[int], named: dict[int, str],
          dynamic: Sequence[DynamicDim], fallback: str) -> list[int | str]:  # fmt: skip
    """A value's dims for its type: a name where the size follows the dynamic axes."""
    dims: list[int | str] = []
    for j, (a, b) in enumerate(zip(shape, other, strict=True)):
        if j in named:
            dims.append(named[j])
        elif a == b:
            dims.append(a)
        else:
            same = [d.name for d in dynamic if (d.traced, d.alternate) == (a, b)]
            dims.append(same[0] if same else f"{fallback}_dim{j}")
    return dims


def _value_infos(emitter: Emitter, calls: list[OpCall], alternate: Trace | None,
                 dynamic: Sequence[DynamicDim], graph_values: set[str]
                 ) -> list[onnx.ValueInfoProto]:  # fmt: skip
    """The type of each op output a node computes (not the graph's inputs, outputs or
    initializers), from both traces."""
    produced = {name for node in emitter.nodes for name in node.output}
    infos, seen = [], set()
    for call in calls:
        other = alternate.calls[call.index] if alternate is not None else call
        for handle, aval, aval_other in zip(call.outputs, call.output_avals, other.output_avals,
                                            strict=True):  # fmt: skip
            name = emitter.known(handle)
            if name is None or name in seen or name not in produced or name not in graph_values:
                continue
            seen.add(name)
            dims = _dims(aval.shape, aval_other.shape, {}, dynamic, name)
            infos.append(helper.make_tensor_value_info(name, onnx_type(aval.dtype), dims))
    return infos


def build_model(trace: Trace, alternate: Trace | None, *, opset: int, input_names: list[str],
                output_names: list[str], dynamic: Sequence[DynamicDim],
                dynamic_axes: dict[str, dict[int, str]], value_info: bool = True
                ) -> onnx.ModelProto:  # fmt: skip
    """The ONNX model of ``trace`` (``alternate``: the same forward at other dynamic sizes);
    with ``value_info``, each op output's traced type, dynamic dims by name."""
    names = {id(h): name for h, name in zip(trace.inputs, input_names, strict=True)}
    for key, (path, _handle) in trace.params.items():
        if path in input_names or path in output_names:
            raise ExportError(f"ONNX export: the name {path!r} is both a parameter and an input "
                              f"or output name; choose other input_names / output_names")
        names.setdefault(key, path)
    # An output a node computes takes its name directly; one that is an input, a parameter,
    # another output or an exporter's alias of a value is copied by an Identity at the end.
    for handle, name in zip(trace.outputs, output_names, strict=True):
        names.setdefault(id(handle), name)
    emitter = Emitter(trace, alternate, opset, names, dynamic)
    calls = live_calls(trace)
    for call in calls:
        emitter.set_scope(call.module_path)
        if call.module is not None:  # a module exported whole
            rule = module_rule_for(call.module)
            assert rule is not None
            rule(emitter, call)
            continue
        spec = rule_for(call.op.name, call.kind, opset)
        if spec is None:
            raise UnsupportedExportError(call.op.name, call.primitive, call.module_path,
                                         why_no_form(call.op.name, call.kind, opset))
        spec.fn(emitter, call)
    emitter.set_scope("")
    for handle, name in zip(trace.outputs, output_names, strict=True):
        if emitter.name(handle) != name:
            emitter.node("Identity", [emitter.name(handle)], [name])
    used = {name for node in emitter.nodes for name in node.input}
    initializers = [t for t in emitter.initializers if t.name in used]
    for path, handle in trace.params.values():
        if path in used:
            initializers.append(onnx.numpy_helper.from_array(trace.value(handle), path))
    inputs = []
    for i, (name, aval) in enumerate(zip(input_names, trace.input_avals, strict=True)):
        other = alternate.input_avals[i].shape if alternate else aval.shape
        dims = _dims(aval.shape, other, dynamic_axes.get(name, {}), dynamic, name)
        inputs.append(helper.make_tensor_value_info(name, onnx_type(aval.dtype), dims))
    outputs = []
    for i, (name, aval) in enumerate(zip(output_names, trace.output_avals, strict=True)):
        other = alternate.output_avals[i].shape if alternate else aval.shape
        dims = _dims(aval.shape, other, dynamic_axes.get(name, {}), dynamic, name)
        outputs.append(helper.make_tensor_value_info(name, onnx_type(aval.dtype), dims))
    intermediate = used - set(output_names)
    infos = _value_infos(emitter, calls, alternate, dynamic, intermediate) if value_info else []
    graph = helper.make_graph(emitter.nodes, "ember_model", inputs, outputs, initializers,
                              value_info=infos)  # fmt: skip
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="ember")
    model.ir_version = helper.find_min_ir_version_for(opsets)
    return model
