"""Layout ops: reshape, permute, expand, flip, slice, cat, repeat, argwhere.

Their shape attributes may follow a dynamic axis: a reshape writes -1 for the one entry
that does, an expand writes 1 where the input already has the size, a slice runs to the
end; anything else is computed from the dynamic input dims (``Emitter.sizes``).
"""

from __future__ import annotations

from ember.onnx.export.emitter import Emitter
from ember.onnx.export.registry import exporter
from ember.onnx.export.tracer import OpCall

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


def _input_shape(call: OpCall, i: int = 0) -> tuple[int, ...]:
    aval = call.input_avals[i]
    assert aval is not None
    return aval.shape


@exporter("reshape")
def reshape(e: Emitter, call: OpCall) -> None:
    traced, other = list(call.attr("shape")), list(e.alternate_attr(call, "shape"))
    differing = [j for j, (a, b) in enumerate(zip(traced, other, strict=True)) if a != b]
    # One entry that follows the dynamic axes is what is left: -1.
    fallback = (lambda j: -1) if len(differing) == 1 else None
    shape = e.sizes(call, traced, other, fallback)
    e.node("Reshape", [e.input(call, 0), shape], [e.output(call)],
           allowzero=1 if 0 in traced else None)  # fmt: skip


@exporter("permute")
def permute(e: Emitter, call: OpCall) -> None:
    e.node("Transpose", [e.input(call, 0)], [e.output(call)], perm=list(e.static(call, "axes")))


@exporter("expand")
def expand(e: Emitter, call: OpCall) -> None:
    traced, other = list(call.attr("shape")), list(e.alternate_attr(call, "shape"))
    x_traced, x_other = _input_shape(call), e.alternate_input_shape(call, 0)
    lead = len(traced) - len(x_traced)

    def keep_input_size(j: int) -> int | None:
        # Expand broadcasts: a 1 keeps the input's own size, dynamic or not.
        k = j - lead
        if k >= 0 and x_traced[k] == traced[j] and x_other[k] == other[j]:
            return 1
        return None

    shape = e.sizes(call, traced, other, keep_input_size)
    e.node("Expand", [e.input(call, 0), shape], [e.output(call)])


@exporter("flip")
def flip(e: Emitter, call: OpCall) -> None:
    axes = list(e.static(call, "axes"))
    if not axes:
        e.bind(call, e.input(call, 0))
        return
    n = len(axes)
    e.node("Slice", [e.input(call, 0), e.ints([-1] * n), e.ints([INT64_MIN] * n), e.ints(axes),
                     e.ints([-1] * n)], [e.output(call)])  # fmt: skip


@exporter("slice")
def slice_(e: Emitter, call: OpCall) -> None:
    ranges, other = call.attr("ranges"), e.alternate_attr(call, "ranges")
    x_traced, x_other = _input_shape(call), e.alternate_input_shape(call, 0)

    def to_end(j: int) -> int | None:
        # A range that runs to the end of a dynamic dim: to the end, whatever its size.
        if ranges[j][1] == x_traced[j] and other[j][1] == x_other[j]:
            return INT64_MAX
        return None

    starts = e.sizes(call, [r[0] for r in ranges], [r[0] for r in other])
    ends = e.sizes(call, [r[1] for r in ranges], [r[1] for r in other], to_end)
    steps = [r[2] for r in ranges]
    axes = list(range(len(ranges)))
    e.node("Slice", [e.input(call, 0), starts, ends, e.ints(axes), e.ints(steps)],
           [e.output(call)])  # fmt: skip


@exporter("cat")
def cat(e: Emitter, call: OpCall) -> None:
    inputs = [e.input(call, i) for i in range(len(call.inputs))]
    e.node("Concat", inputs, [e.output(call)], axis=e.static(call, "dim"))


@exporter("repeat_dim")
def repeat_dim(e: Emitter, call: OpCall) -> None:
    """The whole tensor ``times`` times along ``dim`` (a tile, not an interleave)."""
    repeats = [1] * len(_input_shape(call))
    repeats[e.static(call, "dim")] = e.static(call, "times")
    e.node("Tile", [e.input(call, 0), e.ints(repeats)], [e.output(call)])


@exporter("argwhere")
def argwhere(e: Emitter, call: OpCall) -> None:
    """The indices of the true elements, one row each: NonZero gives them one column each."""
    e.node("Transpose", [e.node("NonZero", [e.input(call, 0)])], [e.output(call)], perm=[1, 0])
