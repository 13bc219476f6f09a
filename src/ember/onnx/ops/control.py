"""Control flow: If, Loop and Scan, whose bodies are subgraphs.

A body becomes a block of plain Python inside ``forward``: ``If`` an ``if``/``else``
on the condition's value, ``Loop`` and ``Scan`` a ``for`` loop whose loop-carried
values are local variables reassigned at the end of each step and whose scan outputs
are lists stacked after the loop. Body nodes read outer values by name, as in ONNX.
An ``If`` whose condition is known at import time becomes its taken branch alone.

Sequence- and optional-typed values (ONNX 13 and 16 loops over sequences) are not
tensors and stay unsupported.
"""

from __future__ import annotations

import numpy as np

from ember.onnx.context import NodeContext, Subgraph, Value
from ember.onnx.registry import converter

_INDENT = "    "


def _block(lines: list[str]) -> list[str]:
    """``lines`` indented one level (``pass`` when empty, so the block stays valid)."""
    return [_INDENT + line for line in lines] or [_INDENT + "pass"]


def _check_outputs(node: NodeContext, body: Subgraph, expected: int, what: str) -> None:
    if body.num_outputs != expected:
        node.unsupported(f"{what} has {body.num_outputs} outputs, {expected} were expected")


def _device(node: NodeContext, inputs: list[Value]) -> str:
    """An expression of the device the node runs on: that of a runtime input, else of a
    constant's module field."""
    present = [v for v in inputs if v.present]
    for value in [*(v for v in present if not v.is_const), *present]:
        return f"{value.expr}.device"
    node.unsupported("the node has no input to take the device from")


def _stack(items: str, dim: int, body: Subgraph, index: int, device: str | None) -> str:
    """Stacking per-step results along a new ``dim``; with no step, an empty tensor when the
    step's shape is known."""
    stacked = f"Tensor.stack({items}, {dim})"
    shape, dtype = body.output_shape(index), body.output_dtype(index)
    if device is None or dtype is None or shape is None \
            or not all(isinstance(d, int) for d in shape):
        return stacked
    empty = list(shape)
    empty.insert(dim if dim >= 0 else len(empty) + 1 + dim, 0)
    return f"{stacked} if {items} else Tensor.zeros({empty}, {device}, {dtype.value!r})"


# ---------------------------------------------------------------------------------- If
@converter("If", since=1, attrs=("then_branch", "else_branch"),
           limits="sequence- and optional-typed branch outputs")  # fmt: skip
def if_(node: NodeContext) -> list[str]:
    cond = node.input(0)
    if cond.is_const:
        # Known at import time: the taken branch is the whole node.
        taken = bool(np.asarray(cond.const).reshape(-1)[0])
        branch = node.body("then_branch" if taken else "else_branch")
        _check_outputs(node, branch, len(node.outputs), "the branch")
        lines = list(branch.lines)
        for i, out in enumerate(node.outputs):
            const = branch.output_const(i)
            if const is not None and not branch.output_trainable(i):
                node.set_constant(i, const)
            else:
                lines.append(f"{out} = {branch.output(i)}")
        return lines
    blocks = []
    for attr in ("then_branch", "else_branch"):
        branch = node.body(attr)
        _check_outputs(node, branch, len(node.outputs), f"{attr}")
        blocks.append([*branch.lines, *(f"{out} = {branch.output(i)}"
                                        for i, out in enumerate(node.outputs))])
    return [f"if {cond.expr}:", *_block(blocks[0]), "else:", *_block(blocks[1])]


# ---------------------------------------------------------------------------------- Loop
@converter("Loop", since=1, attrs=("body",),
           limits="sequence- and optional-typed loop-carried values")  # fmt: skip
def loop(node: NodeContext) -> list[str]:
    trip, cond = node.input(0), node.input(1)
    carried = node.inputs[2:]
    n = len(carried)
    if not trip.present and not cond.present:
        node.unsupported("a loop with neither a trip count nor a condition never ends")
    scans = [k for k in range(len(node.outputs) - n) if node.output_used(n + k)]
    # Without a condition input, ONNX ignores the body's condition output.
    keep = [cond.present, *[True] * n, *(k in scans for k in range(len(node.outputs) - n))]
    body = node.body("body", keep=keep)
    if body.num_outputs != len(node.outputs) + 1:
        node.unsupported(f"the body has {body.num_outputs} outputs, {len(node.outputs) + 1} (the "
                         f"condition and one per node output) were expected")
    counter, cond_var, *state = body.inputs
    lines: list[str] = []
    need_device = body.input_used(0) or (body.input_used(1) and not cond.present) or scans
    device = None
    if need_device:
        device = node.tmp("device")
        lines.append(f"{device} = {_device(node, node.inputs)}")
    if cond.present or body.input_used(1):
        start = cond.expr if cond.present else f"Tensor.from_data(True, {device})"
        lines.append(f"{cond_var} = {start}")
    for var, value in zip(state, carried):
        lines.append(f"{var} = {value.expr}")
    lists = [node.tmp("scan") for _ in scans]
    lines.extend(f"{items} = []" for items in lists)

    step = node.tmp("i")
    inner: list[str] = []
    if trip.present:
        count = str(trip.ints()[0]) if trip.is_const else f"int({trip.expr})"
        head = f"for {step} in range({count}):"
        if cond.present:
            inner += [f"if not {cond_var}:", f"{_INDENT}break"]
    else:
        lines.append(f"{step} = 0")
        head = f"while {cond_var}:"
    if body.input_used(0):
        inner.append(f"{counter} = Tensor.from_data({step}, {device}, 'i64')")
    inner += body.lines
    targets = ([cond_var] if cond.present else []) + state
    values = [body.output(i) for i in range(0 if cond.present else 1, 1 + n)]
    if targets:
        inner.append(f"{', '.join(targets)} = {', '.join(values)}")
    for k, items in zip(scans, lists):
        inner.append(f"{items}.append({body.output(1 + n + k)})")
    if not trip.present:
        inner.append(f"{step} += 1")
    lines += [head, *_block(inner)]
    for out, var in zip(node.outputs[:n], state):
        lines.append(f"{out} = {var}")
    for k, items in zip(scans, lists):
        lines.append(f"{node.outputs[n + k]} = {_stack(items, 0, body, 1 + n + k, device)}")
    return lines


# ---------------------------------------------------------------------------------- Scan
def _axis(value: Value, axis: int, extra: int = 0) -> str:
    """A possibly negative axis of ``value`` (plus ``extra`` leading dims) as code."""
    if axis >= 0:
        return str(axis)
    rank = value.rank
    return str(axis + rank - extra) if rank is not None else f"{value.expr}.rank - {extra - axis}"


def _scan(node: NodeContext, states: list[Value], scanned: list[Value], input_axes: list[int],
          input_reverse: list[bool], output_axes: list[int], output_reverse: list[bool],
          batch: str | None = None) -> tuple[list[str], list[str]]:  # fmt: skip
    """The lines of a scan and the expression of each of its results (final states, then
    stacked scan outputs). With ``batch`` (the opset-8 form), the scan runs on row
    ``batch`` of every input."""
    n, m = len(states), len(scanned)
    body = node.body("body")
    if len(body.inputs) != n + m:
        node.unsupported(f"the body has {len(body.inputs)} inputs, {n + m} were expected")
    if body.num_outputs < n:
        node.unsupported(f"the body has {body.num_outputs} outputs, at least {n} were expected")
    if not m:
        node.unsupported("a scan needs at least one scanned input")
    extra = 0 if batch is None else 1

    def row(value: Value) -> str:
        return value.expr if batch is None else f"{value.expr}.narrow(0, {batch}, 1).squeeze(0)"

    lines = [f"{var} = {row(value)}" for var, value in zip(body.inputs[:n], states)]
    sources = []
    for value, axis in zip(scanned, input_axes):
        source = node.tmp("seq")
        lines.append(f"{source} = {row(value)}")
        sources.append((source, _axis(value, axis, extra)))
    length = node.tmp("length")
    lines.append(f"{length} = {sources[0][0]}.shape[{sources[0][1]}]")
    lists = [node.tmp("scan") for _ in range(body.num_outputs - n)]
    lines.extend(f"{items} = []" for items in lists)
    step = node.tmp("t")
    inner = []
    for var, (source, axis), reverse in zip(body.inputs[n:], sources, input_reverse):
        at = f"{length} - 1 - {step}" if reverse else step
        inner.append(f"{var} = {source}.narrow({axis}, {at}, 1).squeeze({axis})")
    inner += body.lines
    if n:
        inner.append(f"{', '.join(body.inputs[:n])} = "
                     f"{', '.join(body.output(i) for i in range(n))}")
    for k, items in enumerate(lists):
        inner.append(f"{items}.append({body.output(n + k)})")
    lines += [f"for {step} in range({length}):", *_block(inner)]
    results = list(body.inputs[:n])
    for k, items in enumerate(lists):
        ordered = f"{items}[::-1]" if output_reverse[k] else items
        results.append(f"Tensor.stack({ordered}, {output_axes[k]})")
    return lines, results


def _flags(node: NodeContext, name: str, count: int) -> list[int]:
    values = list(node.attr(name, [0] * count))
    if len(values) != count:
        node.unsupported(f"{name} has {len(values)} entries, {count} were expected")
    return [int(v) for v in values]


@converter("Scan", since=9, attrs=("body", "num_scan_inputs", "scan_input_axes",
                                   "scan_input_directions", "scan_output_axes",
                                   "scan_output_directions"))  # fmt: skip
def scan(node: NodeContext) -> list[str]:
    m = int(node.attr("num_scan_inputs"))
    inputs = node.inputs
    n = len(inputs) - m
    k = len(node.outputs) - n
    if n < 0 or k < 0:
        node.unsupported(f"num_scan_inputs={m} does not fit {len(inputs)} inputs and "
                         f"{len(node.outputs)} outputs")
    lines, results = _scan(
        node, inputs[:n], inputs[n:], _flags(node, "scan_input_axes", m),
        [bool(d) for d in _flags(node, "scan_input_directions", m)],
        _flags(node, "scan_output_axes", k),
        [bool(d) for d in _flags(node, "scan_output_directions", k)],
    )
    return lines + [f"{out} = {value}" for out, value in zip(node.outputs, results)]


@converter("Scan", since=8, attrs=("body", "num_scan_inputs", "directions"),
           limits="sequence_lens must be absent or cover whole sequences")  # fmt: skip
def scan_batched(node: NodeContext) -> list[str]:
    """Opset 8: every input has a leading batch dim; the scan runs once per batch row and
    the results are stacked back along that dim."""
    m = int(node.attr("num_scan_inputs"))
    lengths, inputs = node.input(0), node.inputs[1:]
    n = len(inputs) - m
    k = len(node.outputs) - n
    if n < 0 or k < 0:
        node.unsupported(f"num_scan_inputs={m} does not fit {len(inputs)} inputs and "
                         f"{len(node.outputs)} outputs")
    scanned = inputs[n:]
    if lengths.present:
        full = scanned[0].static_shape
        if not lengths.is_const or full is None or any(v != full[1] for v in lengths.ints()):
            node.unsupported("sequence_lens shorter than the scanned inputs are not supported")
    batch = node.tmp("b")
    lines, results = _scan(node, inputs[:n], scanned, [0] * m,
                           [bool(d) for d in _flags(node, "directions", m)], [0] * k,
                           [False] * k, batch)
    rows = [node.tmp("rows") for _ in results]
    head = [f"{items} = []" for items in rows]
    collect = [f"{items}.append({value})" for items, value in zip(rows, results)]
    size = f"{scanned[0].expr}.shape[0]"
    return [*head, f"for {batch} in range({size}):", *_block(lines + collect),
            *(f"{out} = Tensor.stack({items}, 0)" for out, items in zip(node.outputs, rows))]
