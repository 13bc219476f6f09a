"""Trace: a decorator that reports every op a backend runs.

It is the smallest decorator: its primitives are the inner backend's, and its
``call`` hands each op to a callback before running it. Use it to see which
ops a model runs, to count them, or to check that a decorator stack composes.

Example:
    >>> import ember
    >>> from ember import Tensor
    >>> from ember.backends.trace import Trace
    >>> seen = []
    >>> device = ember.device("ndarray").wrap(lambda b: Trace(b, seen.append))
    >>> _ = Tensor.ones([2], device) + 1.0
    >>> [record.primitive for record in seen]
    ['float_ones', 'float_add_scalar']
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ember.backend.base import Backend
from ember.backend.decorator import Decorator
from ember.backend.ops import OpDef


@dataclass(frozen=True)
class OpRecord:
    """One op call: the op's name, the backend primitive and the shapes of its tensor operands."""

    op: str
    primitive: str
    shapes: tuple[tuple[int, ...], ...]

    def __str__(self) -> str:
        return f"{self.primitive}{list(map(list, self.shapes))}"


def print_record(record: OpRecord) -> None:
    print(f"[ember] {record}", file=sys.stderr)


class Trace(Decorator):
    """Reports each op to ``on_op`` (by default: prints it to stderr), then runs it.

    Args:
        inner: the traced backend.
        on_op: called with an :class:`OpRecord` per op.
    """

    prefix = "trace"

    def __init__(self, inner: Backend, on_op: Callable[[OpRecord], Any] = print_record) -> None:
        super().__init__(inner)
        self.on_op = on_op

    def call(self, op: OpDef, name: str, args: tuple) -> Any:
        shapes = tuple(self.shape(t) for t in self.operands(op, args) if t is not None)
        self.on_op(OpRecord(op.name, name, shapes))
        return self.forward(op, name, args)
