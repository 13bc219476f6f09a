"""The backward-rule registry and the helpers rules share.

A rule is one small function per differentiable op, registered under the op's
table name::

    @backward("mul", keep="inputs")
    def _mul(B, g, s):
        a, b = s.inputs
        return unbroadcast(B, B.float_mul(g, b), s.shapes[0]), unbroadcast(B, B.float_mul(g, a), s.shapes[1])

``B`` is the inner backend, ``g`` the gradient of the op's (first) output as an
inner primitive, and ``s`` the :class:`Saved` state. A rule returns one
gradient (or None) per tensor input; ``s.needs[i]`` says whether input ``i`` is
tracked, so a rule may skip costly gradients nobody will read. A gradient that is
zero outside one region of its input may be returned as a
:class:`~ember.backends.autodiff.partial.Partial` (the slice rule does): the
engine assembles each input's pieces once. ``keep`` names
what the forward pass must save: ``"inputs"``, ``"output"``, both, or nothing (input shapes, dtypes and
the attributes are always kept; they are small).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    fn: Callable
    keep_inputs: bool
    keep_output: bool


class Saved:
    """What a node keeps for its backward rule."""

    __slots__ = ("attrs", "dtypes", "inputs", "needs", "output", "shapes")

    def __init__(self, inputs, output, attrs, shapes, dtypes, needs) -> None:
        self.inputs = inputs
        self.output = output
        self.attrs = attrs
        self.shapes = shapes
        self.dtypes = dtypes
        self.needs = needs  # per input: whether a gradient flows to it (a rule may skip the rest)

    def with_needs(self, needs: tuple[bool, ...]) -> Saved:
        """The same state, with fewer inputs needing a gradient."""
        return Saved(self.inputs, self.output, self.attrs, self.shapes, self.dtypes, needs)


RULES: dict[str, Rule] = {}


def backward(*ops: str, keep: str | tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Registers the decorated function as the backward rule of ``ops``."""
    keep = (keep,) if isinstance(keep, str) else keep
    unknown = set(keep) - {"inputs", "output"}
    if unknown:
        raise ValueError(f"keep may name 'inputs' and 'output', not {sorted(unknown)}")

    def register(fn: Callable) -> Callable:
        for op in ops:
            if op in RULES:
                raise RuntimeError(f"backward rule for {op!r} registered twice")
            RULES[op] = Rule(fn, "inputs" in keep, "output" in keep)
        return fn

    return register


# ------------------------------------------------------------------ shared helpers
def unbroadcast(B, g: Any, shape: tuple[int, ...]) -> Any:
    """Sums ``g`` over the dims broadcasting added or stretched, back to ``shape``."""
    g_shape = B.shape(g)
    if g_shape == shape:
        return g
    lead = len(g_shape) - len(shape)
    for dim in range(len(g_shape)):
        if dim < lead or (shape[dim - lead] == 1 and g_shape[dim] != 1):
            g = B.float_sum_dim(g, dim)
    return B.float_reshape(g, shape)


def zeros(B, like: Any, shape: tuple[int, ...] | None = None) -> Any:
    """Zeros of ``like``'s dtype and device (and its shape unless given)."""
    return B.float_full(shape if shape is not None else B.shape(like), 0.0, B.device_of(like), B.dtype(like))
