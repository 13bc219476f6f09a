"""Metrics of a training run: the protocol (``base``) and the built-in metrics."""

from ember.train.metric.base import (
    Metric,
    MetricEntry,
    MetricMetadata,
    Numeric,
    NumericMetricState,
    Progress,
    adapt,
    adaptor,
)

__all__ = [
    "Metric", "MetricEntry", "MetricMetadata", "Numeric", "NumericMetricState", "Progress",
    "adapt", "adaptor",
]  # fmt: skip
