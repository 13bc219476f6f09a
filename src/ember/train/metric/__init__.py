"""Metrics of a training run: the protocol (``base``) and the built-in metrics."""

from ember.train.metric.base import (
    MeanMetric,
    Metric,
    MetricEntry,
    MetricMetadata,
    Numeric,
    NumericMetricState,
    Progress,
    adapt,
    adaptor,
    format_entry,
)

__all__ = [
    "MeanMetric", "Metric", "MetricEntry", "MetricMetadata", "Numeric", "NumericMetricState", "Progress",
    "adapt", "adaptor", "format_entry",
]  # fmt: skip

# The built-in metrics (psutil and pynvml are imported only when a system metric is made).
from ember.train.metric.accuracy import (
    AccuracyInput,
    AccuracyMetric,
    TopKAccuracyInput,
    TopKAccuracyMetric,
)
from ember.train.metric.auroc import AurocInput, AurocMetric
from ember.train.metric.classification import (
    ClassReduction,
    ConfusionStatsInput,
    DecisionRule,
    FBetaScoreMetric,
    PrecisionMetric,
    RecallMetric,
    Threshold,
    TopK,
)
from ember.train.metric.cpu import CpuMemory, CpuTemperature, CpuUse
from ember.train.metric.gpu import (
    CudaMetric,
    GpuMemory,
    GpuTemperature,
    GpuUse,
    nvml_unavailable,
)
from ember.train.metric.learning_rate import LearningRateMetric
from ember.train.metric.loss import LossInput, LossMetric

__all__ += [
    "AccuracyInput", "AccuracyMetric", "AurocInput", "AurocMetric", "ClassReduction",
    "ConfusionStatsInput", "CpuMemory", "CpuTemperature", "CpuUse", "CudaMetric",
    "DecisionRule", "FBetaScoreMetric", "GpuMemory", "GpuTemperature", "GpuUse",
    "LearningRateMetric", "LossInput", "LossMetric", "PrecisionMetric", "RecallMetric",
    "Threshold", "TopK", "TopKAccuracyInput", "TopKAccuracyMetric", "nvml_unavailable",
]  # fmt: skip
