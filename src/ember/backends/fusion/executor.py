"""Running records on the inner backend, one primitive call each (the unfused path).

This is what runs every record no fuser takes, and the whole stream when fusion is off.
"""

from __future__ import annotations

from ember.backend.base import Backend
from ember.backend.errors import EmberError, fmt_shape
from ember.backends.fusion import counters
from ember.backends.fusion.handle import Slot
from ember.backends.fusion.stream import Record


def inner_args(record: Record) -> list:
    """The record's arguments with each slot replaced by its (made) inner primitive."""
    args = list(record.args)
    for i, arg in enumerate(args):
        if type(arg) is Slot:
            args[i] = _made(arg, record)
        elif type(arg) is list and arg and type(arg[0]) is Slot:
            args[i] = [_made(s, record) for s in arg]
    return args


def _made(slot: Slot, record: Record):
    if slot.prim is None:
        raise EmberError(f"fusion: {record.name} reads %{slot.id}, which an earlier failed op "
                         "was to make")  # fmt: skip
    return slot.prim


def run_record(inner: Backend, record: Record) -> None:
    """Runs one record on ``inner`` and stores its outputs in their slots."""
    out = getattr(inner, record.name)(*inner_args(record))
    outs = out if record.multi else (out,)
    for slot, prim in zip(record.outputs, outs, strict=True):
        set_output(inner, slot, prim, record.name)


def set_output(inner: Backend, slot: Slot, prim, what: str) -> None:
    """Stores ``prim`` in ``slot``, checking it is what the op's rule promised: the user
    already holds the promised shape and dtype, so a mismatch is a bug worth a loud error."""
    shape, dtype = inner.shape(prim), inner.dtype(prim)
    if shape != slot.shape or dtype is not slot.dtype:
        raise EmberError(
            f"fusion: {what} made {fmt_shape(shape)} {dtype}, its rule said "
            f"{fmt_shape(slot.shape)} {slot.dtype}"
        )
    slot.prim = prim


class Executor:
    """Runs a stream's records on ``inner``, one primitive call each."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner

    def __call__(self, records: list[Record]) -> None:
        counters.add("unfused_ops", len(records))
        for record in records:
            run_record(self.inner, record)
