"""The learner: a training loop configured with a builder, as Burn's ``LearnerBuilder``.

``LearnerBuilder(artifact_dir)`` collects the options (metrics, loggers, renderer,
gradient accumulation, checkpoints, epochs, devices, resume, early stopping, summary)
and ``build(model, optimizer, lr_scheduler)`` returns a :class:`Learner`, whose
``fit(train_loader, valid_loader)`` trains and returns the model. The model defines
``train_step`` and ``valid_step`` (:mod:`ember.train.step`).
"""

from ember.train.learner.builder import LearnerBuilder, default_renderer
from ember.train.learner.checkpoint import FileCheckpointer, TrainingState
from ember.train.learner.early_stopping import MetricEarlyStopping
from ember.train.learner.history import MetricHistory
from ember.train.learner.learner import Learner
from ember.train.learner.summary import LearnerSummary, MetricSummary

__all__ = [
    "FileCheckpointer", "Learner", "LearnerBuilder", "LearnerSummary", "MetricEarlyStopping",
    "MetricHistory", "MetricSummary", "TrainingState", "default_renderer",
]  # fmt: skip
