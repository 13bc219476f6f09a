"""Fusion: a backend decorator that records ops lazily, fuses them and runs compiled kernels.

``ember.device("ndarray").fusion()`` records ops into per-thread streams, and runs them
when a value is needed, fusing element-wise chains (and reductions over one axis) into
blocks (``ir.py``) that a runtime computes in one pass. Plan and state:
``docs/fusion_plan.md``.
"""

# First: numba_target widens numba's vectors on import, before any kernel exists.
from ember.backends.fusion import numba_target  # noqa: F401
from ember.backends.fusion.backend import Fusion
from ember.backends.fusion.counters import reset_stats, stats
from ember.backends.fusion.replayed import replay

__all__ = ["Fusion", "replay", "reset_stats", "stats"]
