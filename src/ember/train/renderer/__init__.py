"""Renderers of a training run: the protocol (``base``), the dashboard, the notebook and the
plain one."""

from ember.train.renderer.base import (
    MetricsRenderer,
    MetricUpdate,
    Split,
    TrainingInterrupter,
    TrainingProgress,
)
from ember.train.renderer.notebook import NotebookRenderer
from ember.train.renderer.plain import PlainRenderer

__all__ = [
    "MetricUpdate", "MetricsRenderer", "NotebookRenderer", "PlainRenderer", "Split",
    "TrainingInterrupter", "TrainingProgress",
]  # fmt: skip
