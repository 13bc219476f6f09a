"""Hearing the gradients of a backward pass as they are finished.

Burn's distributed backend submits each parameter's gradient for synchronisation as soon
as the backward pass has finished it, so communication overlaps the rest of the pass. The
backward pass visits nodes in decreasing id order, and a leaf's gradient is complete when
its node is visited (``graph.py``), so that is when a listener hears it.

A listener is installed for the backward passes of the current thread with
:func:`listening`; the pass calls ``on_gradient(node, grad)`` for each leaf it finishes and
``on_finish(grads)`` once at the end, before ``backward()`` returns, so the listener may
wait for its work and replace gradients in ``grads``. Nothing else in ember depends on a
listener: without one, a backward pass is exactly what it was.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

_local = threading.local()


class GradientListener(Protocol):
    """What a backward pass tells a listener (see the module doc)."""

    def on_gradient(self, node: Any, grad: Any) -> None: ...

    def on_finish(self, grads: Any) -> None: ...


def current() -> GradientListener | None:
    """The listener of this thread's backward passes, if any."""
    return getattr(_local, "listener", None)


@contextmanager
def listening(listener: GradientListener) -> Iterator[GradientListener]:
    """Installs ``listener`` for the backward passes this thread runs inside the block."""
    previous = current()
    _local.listener = listener
    try:
        yield listener
    finally:
        _local.listener = previous
