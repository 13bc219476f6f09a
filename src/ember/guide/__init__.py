"""The guide: the Burn book's basic workflow on MNIST, written with ember.

A small convolutional network learns to read handwritten digits. Each step of the
workflow has its module:

* :mod:`ember.guide.model`: the network (:class:`ModelConfig`, :class:`Model`) and
  its training and validation steps;
* :mod:`ember.guide.data`: the batcher that turns MNIST items into normalized tensors;
* :mod:`ember.guide.training`: the run's config and :func:`train`, with the learner
  (metrics, checkpoints, the dashboard);
* :mod:`ember.guide.inference`: :func:`infer`, the trained model on test digits;
* :mod:`ember.guide.custom_training_loop`: the same training without the learner.

The ``ember`` command runs it: ``ember guide train``, ``ember guide infer`` and
``ember guide custom-loop`` (see ``ember guide --help`` and ``examples/guide``).
"""

from ember.guide.custom_training_loop import EpochResult, run
from ember.guide.data import MnistBatch, MnistBatcher
from ember.guide.inference import NoTrainedModelError, infer, load_trained
from ember.guide.model import Model, ModelConfig
from ember.guide.training import TrainingConfig, default_config, train

__all__ = [
    "EpochResult", "MnistBatch", "MnistBatcher", "Model", "ModelConfig", "NoTrainedModelError",
    "TrainingConfig", "default_config", "infer", "load_trained", "run", "train",
]  # fmt: skip
