"""Side effects outside the op table, announced to whoever records a call.

A replayed call (``ember.backends.fusion.replayed``) repeats the ops a traced call ran, not
its Python, so it cannot repeat what that Python changed in place: a batch norm's running
statistics (``RunningState.update``), an optimizer's moments. Code that makes such a change
calls :func:`note`; a tracer that listens (:func:`listening`) then refuses to replay the
call, which keeps running plainly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["listening", "note"]


class _Local(threading.local):
    listener: Callable[[str], None] | None = None


_local = _Local()


def note(what: str) -> None:
    """Announces a side effect of this thread (``what`` finishes "the call ...")."""
    listener = _local.listener
    if listener is not None:
        listener(what)


@contextmanager
def listening(listener: Callable[[str], None]) -> Iterator[None]:
    """Hands this thread's :func:`note` calls to ``listener`` inside the block."""
    previous, _local.listener = _local.listener, listener
    try:
        yield
    finally:
        _local.listener = previous
