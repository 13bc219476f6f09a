"""Renderers of a training run: the protocol (``base``), the dashboard and the plain one."""

from ember.train.renderer.base import (
    MetricsRenderer,
    MetricUpdate,
    Split,
    TrainingInterrupter,
    TrainingProgress,
)
from ember.train.renderer.plain import PlainRenderer

__all__ = [
    "MetricUpdate", "MetricsRenderer", "PlainRenderer", "Split", "TrainingInterrupter",
    "TrainingProgress",
]  # fmt: skip
