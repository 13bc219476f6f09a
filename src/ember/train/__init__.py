"""Training: the Learner, metrics, renderers (dashboard, plain), checkpoints and logging.

The model defines ``train_step(batch) -> TrainOutput`` and ``valid_step(batch) -> output``;
``LearnerBuilder(artifact_dir)`` configures metrics, checkpoints, epochs and the renderer,
and ``build(model, optimizer, lr).fit(train_loader, valid_loader)`` trains it. See
``examples/guide`` for the whole workflow.
"""

from ember.train.learner import FileCheckpointer, Learner, LearnerBuilder, MetricEarlyStopping
from ember.train.logger import FileMetricLogger, InMemoryMetricLogger, MetricLogger
from ember.train.output import (
    ClassificationOutput,
    MultiLabelClassificationOutput,
    RegressionOutput,
)
from ember.train.renderer import MetricsRenderer, TrainingInterrupter
from ember.train.step import TrainOutput

__all__ = [
    "ClassificationOutput", "FileCheckpointer", "FileMetricLogger", "InMemoryMetricLogger",
    "Learner", "LearnerBuilder", "MetricEarlyStopping", "MetricLogger", "MetricsRenderer",
    "MultiLabelClassificationOutput", "RegressionOutput", "TrainOutput", "TrainingInterrupter",
]  # fmt: skip
