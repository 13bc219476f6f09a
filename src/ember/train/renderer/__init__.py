"""Renderers of a training run: the protocol (``base``), the dashboard and the plain one."""

from ember.train.renderer.base import (
    MetricsRenderer,
    MetricUpdate,
    TrainingInterrupter,
    TrainingProgress,
)

__all__ = ["MetricUpdate", "MetricsRenderer", "TrainingInterrupter", "TrainingProgress"]
