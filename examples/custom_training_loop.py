"""A custom training loop (the Burn book's "Custom Training Loop"), on a synthetic task.

A small classifier learns which of its three input features is the largest. The loop
is written out by hand: forward pass, loss, ``backward()``, gradients mapped to the
parameters, one optimizer step at a scheduled learning rate, and a check on the
inference model (``model.valid()``) at the end. The optimizer and scheduler states
save like a model's record, so a run can resume.

Run: ``.venv/bin/python examples/custom_training_loop.py``
"""

from __future__ import annotations

import ember
from ember import Config, Module, Tensor, nn, optim
from ember.optim.lr_scheduler import CosineAnnealingLrSchedulerConfig


class MlpConfig(Config):
    d_input: int
    d_hidden: int
    num_classes: int
    dropout: float = 0.1

    def init(self, device: ember.Device | None = None) -> Mlp:
        return Mlp(
            hidden=nn.LinearConfig(self.d_input, self.d_hidden).init(device),
            norm=nn.LayerNormConfig(self.d_hidden).init(device),
            activation=nn.Gelu(),
            dropout=nn.DropoutConfig(self.dropout).init(),
            output=nn.LinearConfig(self.d_hidden, self.num_classes).init(device),
        )


class Mlp(Module):
    hidden: nn.Linear
    norm: nn.LayerNorm
    activation: nn.Gelu
    dropout: nn.Dropout
    output: nn.Linear

    def forward(self, x: Tensor) -> Tensor:
        return self.output(self.dropout(self.activation(self.norm(self.hidden(x)))))


def train(steps: int = 100, batch: int = 64, seed: int = 0) -> tuple[float, float]:
    """Trains the classifier; returns the last training loss and the final accuracy."""
    device = ember.device("ndarray").autodiff()
    ember.seed(device, seed)
    model = MlpConfig(d_input=3, d_hidden=32, num_classes=3).init(device)
    optimizer = optim.AdamWConfig(gradient_clipping=optim.GradientClippingConfig.Norm(1.0)).init()
    scheduler = CosineAnnealingLrSchedulerConfig(1e-2, num_iters=steps).init()
    loss_fn = nn.CrossEntropyLossConfig(smoothing=0.1).init(device)

    x = Tensor.random([batch, 3], device=device)
    labels = x.argmax(1).reshape([batch])  # the index of the largest feature
    for _ in range(steps):
        loss = loss_fn(model(x), labels)
        grads = optim.GradientsParams.from_grads(loss.backward(), model)
        model = optimizer.step(scheduler.step(), model, grads)

    predicted = model.valid()(x.inner()).argmax(1).reshape([batch])
    accuracy = predicted.equal(labels.inner()).float().mean().item()
    return loss.item(), accuracy


if __name__ == "__main__":
    loss, accuracy = train()
    print(f"last training loss {loss:.3f}, accuracy {accuracy:.2f}")
