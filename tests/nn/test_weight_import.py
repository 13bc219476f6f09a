"""A PyTorch model saved with torch.save loads into the matching ember model and agrees."""

from __future__ import annotations

import torch
from nn_helpers import assert_close, from_torch

from ember import Tensor
from ember.module import Module
from ember.nn import (
    BatchNorm,
    BatchNormConfig,
    Conv2d,
    Conv2dConfig,
    Linear,
    LinearConfig,
    PaddingConfig,
)
from ember.record import LoadArgs, PyTorchFileRecorder


class TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU()
        )
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class Net(Module):
    conv: Conv2d
    norm: BatchNorm
    head: Linear

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm(self.conv(x)).clamp_min(0.0)
        return self.head(x.mean_dim(3).mean_dim(2).flatten(1))


def test_state_dict_file_loads_with_key_remaps(tmp_path, base_device):
    torch.manual_seed(0)
    reference = TorchNet()
    reference.train()
    reference(torch.randn(8, 2, 5, 5))  # moves the running statistics off their defaults
    reference.eval()
    torch.save(reference.state_dict(), tmp_path / "net.pt")

    model = Net(
        conv=Conv2dConfig([2, 4], [3, 3], padding=PaddingConfig.Explicit(1)).init(base_device),
        norm=BatchNormConfig(4).init(base_device),
        head=LinearConfig(4, 3).init(base_device),
    )
    args = (
        LoadArgs(tmp_path / "net.pt")
        .with_key_remap(r"features\.0\.(.*)", "conv.$1")
        .with_key_remap(r"features\.1\.(.*)", "norm.$1")
    )
    model = model.load_record(PyTorchFileRecorder().load(args))

    x = torch.randn(3, 2, 6, 6)
    assert_close(model(from_torch(x, base_device)), reference(x), atol=1e-5)
    assert_close(model.norm.running_var.val(), reference.features[1].running_var)
