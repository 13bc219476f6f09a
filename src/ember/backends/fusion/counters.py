"""Counters of what the fusion decorator did, for tests, benchmarks and ``EMBER_FUSION_DEBUG``.

Example:
    >>> from ember.backends.fusion import stats
    >>> {"kernels", "fused_ops", "cache_hits"} <= set(stats())
    True
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_FIELDS = (
    "streams",  # streams created (one per thread and device)
    "records",  # ops recorded
    "flushes",  # times a stream ran
    "kernels",  # fused blocks launched
    "fused_ops",  # records a fused block computed
    "unfused_ops",  # records run on the inner backend one by one
    "eager_ops",  # ops run at once (value-dependent shapes, index checks, reads)
    "small_ops",  # ops on small made values run at once (backend.SMALL_DEFAULT)
    "explorations",  # streams explored (plan cache misses)
    "cache_hits",  # streams whose plan came from the cache
    "tunings",  # (block kind, size bucket)s timed to choose how they run (autotune.py)
    "in_place",  # outputs written over an input at its last use (blocks, products' sums)
    "op_kernels",  # single ops run by a compiled kernel the tuner chose (op_kernels.py)
    "transposed_products",  # products computed transposed for a reader that transposes them
    "attentions",  # attention segments run as one kernel (attention.py)
    "attention_grads",  # attention gradient segments run as one kernel (attention_grad.py)
    "traces",  # calls of a replayed function traced (replayed.py)
    "replays",  # calls of a replayed function re-recorded from their trace
    "direct_replays",  # replays whose launches ran without records (direct.py)
    "keyed_traces",  # keyed passes traced (keyed.py: Autodiff's backward)
    "keyed_replays",  # keyed passes re-recorded from their trace
    "keyed_direct_replays",  # keyed replays whose launches ran without records
    "joined_in_place",  # joins (cat) whose pieces a direct replay's kernel wrote in place
    "templated_composites",  # composites recorded from their signature's template (composites.py)
)
_counts = dict.fromkeys(_FIELDS, 0)


def add(field: str, n: int = 1) -> None:
    with _lock:
        _counts[field] += n


def add_each(**counts: int) -> None:
    """:func:`add` for several counters under one lock."""
    with _lock:
        for field, n in counts.items():
            _counts[field] += n


def stats() -> dict[str, int]:
    """A copy of the counters since the process started (or the last :func:`reset_stats`)."""
    with _lock:
        return dict(_counts)


def reset_stats() -> None:
    """Sets every counter back to 0."""
    with _lock:
        for field in _FIELDS:
            _counts[field] = 0
