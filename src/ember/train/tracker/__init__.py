"""Experiment trackers: TensorBoard and MLflow as run-level metric loggers of the learner.

``LearnerBuilder(...).tracker(TensorBoardTracker()).tracker(MlflowTracker())`` feeds
both during ``fit`` (see :mod:`ember.train.tracker.base`). Each tracker imports its
library when it is built, so this package imports neither.
"""

from ember.train.tracker.base import (
    ExperimentTracker,
    MissingExtraError,
    RunInfo,
    RunStatus,
    flatten_params,
)
from ember.train.tracker.mlflow_tracker import MlflowTracker
from ember.train.tracker.tensorboard_tracker import TensorBoardTracker

__all__ = [
    "ExperimentTracker", "MissingExtraError", "MlflowTracker", "RunInfo", "RunStatus",
    "TensorBoardTracker", "flatten_params",
]  # fmt: skip
