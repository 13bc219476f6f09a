"""A user's training script, written only to be type-checked (``mypy``, see pyproject.toml).

It reaches ember the way a user does (``import ember`` and its lazy subpackages, the
public classes) so that a change to a public signature that breaks user code fails the
type check. tests/package/test_typing.py runs mypy on it; nothing calls ``main``.
"""

from __future__ import annotations

from pathlib import Path

import ember
from ember import Config, Module, Tensor
from ember.train import ClassificationOutput, Learner, TrainOutput
from ember.train.metric.accuracy import AccuracyMetric
from ember.train.metric.loss import LossMetric
from ember.train.tracker import MlflowTracker, TensorBoardTracker


class ModelConfig(Config):
    features: int = 4
    classes: int = 3

    def init(self, device: ember.Device) -> Model:
        # Configs are checked with their fields by name: type checkers see pydantic's
        # keyword-only constructor (ember also takes the required fields positionally).
        linear = ember.nn.LinearConfig(d_input=self.features, d_output=self.classes)
        return Model(linear.init(device), ember.nn.CrossEntropyLossConfig().init())


class Model(Module):
    linear: ember.nn.Linear
    loss: ember.nn.CrossEntropyLoss

    def forward(self, x: Tensor) -> Tensor:
        return ember.activation.relu(self.linear(x))

    def valid_step(self, batch: tuple[Tensor, Tensor]) -> ClassificationOutput:
        x, y = batch
        logits = self.forward(x)
        return ClassificationOutput(self.loss(logits, y), logits, y)

    def train_step(self, batch: tuple[Tensor, Tensor]) -> TrainOutput[ClassificationOutput]:
        item = self.valid_step(batch)
        return TrainOutput.new(self, item.loss.backward(), item)


def learner(artifact_dir: Path, config: ModelConfig) -> Learner:
    device = ember.device("ndarray").autodiff()
    ember.seed(device, 0)
    model = config.init(device)
    return (
        ember.train.LearnerBuilder(artifact_dir)
        .metric_train_numeric(LossMetric())
        .metric_valid_numeric(AccuracyMetric())
        .tracker(TensorBoardTracker(artifact_dir / "tensorboard"))
        .tracker(MlflowTracker("sqlite:///runs.db", experiment="typed"))
        .params(config)
        .num_epochs(2)
        .build(model, ember.optim.AdamConfig().init(), 1e-3)
    )


def main() -> None:
    x = Tensor.from_data([[1.0, 2.0, 3.0, 4.0]], device=ember.device("ndarray"))
    total: float = x.sum().item()
    print(total, learner(Path("/tmp/run"), ModelConfig()))
