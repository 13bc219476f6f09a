"""Helpers of the optimizer tests: a two-layer model in ember and in PyTorch with the same
weights, one loss, and the parameter trajectories of training runs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ember import Tensor, TensorData
from ember.module import Module, Param
from ember.nn.linear import Linear
from ember.optim.optimizer import Optimizer

D_IN, D_HIDDEN, D_OUT, BATCH = 4, 5, 3, 8
PARAMS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


class Mlp(Module):
    fc1: Linear
    fc2: Linear

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.fc1(x).tanh())


def torch_mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Module()
    model.fc1 = torch.nn.Linear(D_IN, D_HIDDEN)
    model.fc2 = torch.nn.Linear(D_HIDDEN, D_OUT)
    return model


def torch_forward(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model.fc2(torch.tanh(model.fc1(x)))


def _data(t: torch.Tensor) -> TensorData:
    return TensorData(t.detach().cpu().numpy())


def ember_mlp(reference: torch.nn.Module, device) -> Mlp:
    """An ember copy of ``reference`` (PyTorch keeps Linear weights transposed)."""

    def linear(layer: torch.nn.Linear) -> Linear:
        weight = Tensor.from_data(_data(layer.weight.T.contiguous()), device)
        return Linear(Param(weight), Param(Tensor.from_data(_data(layer.bias), device)))

    return Mlp(linear(reference.fc1), linear(reference.fc2))


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets; the targets are large so that gradients are worth clipping."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, D_IN, generator=generator)
    target = 3.0 * torch.randn(BATCH, D_OUT, generator=generator)
    return x, target


def ember_loss(model: Mlp, x: Tensor, target: Tensor) -> Tensor:
    diff = model(x) - target
    return (diff * diff).mean()


def snapshot(model: Mlp) -> list[np.ndarray]:
    """The parameters in PARAMS order, in PyTorch's layouts."""
    values = dict((path, p.val().to_numpy()) for path, p in model.params())
    return [values[p].T if p.endswith("weight") else values[p] for p in PARAMS]


def torch_snapshot(model: torch.nn.Module) -> list[np.ndarray]:
    values = dict(model.named_parameters())
    return [values[p].detach().cpu().numpy().copy() for p in PARAMS]


def train_ember(optimizer: Optimizer, model: Mlp, lr: float, steps: int,
                device) -> tuple[Mlp, list[list[np.ndarray]]]:  # fmt: skip
    """``steps`` optimizer steps; returns the last model and the parameters after each step."""
    x, target = (Tensor.from_data(_data(t), device) for t in batch())
    trajectory = []
    for _ in range(steps):
        grads = ember_loss(model, x, target).backward()
        model = optimizer.step(lr, model, grads)
        trajectory.append(snapshot(model))
    return model, trajectory


def train_torch(make_optimizer: Callable, model: torch.nn.Module, steps: int,
                clip: Callable[[torch.nn.Parameter], bool] | None = None
                ) -> tuple[list[list[np.ndarray]], bool]:  # fmt: skip
    """``steps`` steps of a torch.optim optimizer; ``clip(param)`` clips one parameter's gradient
    in place and says whether it changed it. Returns the trajectory and whether any clip acted."""
    x, target = batch()
    optimizer = make_optimizer(model.parameters())
    trajectory, clipped = [], False
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(torch_forward(model, x), target).backward()
        if clip is not None:
            for param in model.parameters():
                clipped |= clip(param)
        optimizer.step()
        trajectory.append(torch_snapshot(model))
    return trajectory, clipped


def assert_trajectories_close(actual, expected, atol: float = 2e-5, rtol: float = 1e-4) -> None:
    assert len(actual) == len(expected)
    for step, (ours, theirs) in enumerate(zip(actual, expected)):
        for name, a, b in zip(PARAMS, ours, theirs):
            np.testing.assert_allclose(
                a, b, atol=atol, rtol=rtol, err_msg=f"{name} after step {step + 1}"
            )
