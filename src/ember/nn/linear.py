"""Linear: the affine map ``x @ W + b`` over the last dim."""

from __future__ import annotations

import math
from typing import Any

from ember.backend.device import Device
from ember.backend.errors import ShapeError, fmt_shape
from ember.config import Config
from ember.config.fields import PositiveInt
from ember.module import Module, Param
from ember.nn.initializer import Initializer, KaimingUniform
from ember.record.adapter import PYTORCH
from ember.tensor import Tensor, TensorData


class LinearConfig(Config):
    """Configuration of a :class:`Linear` layer.

    Args:
        d_input: size of each input (the last dim of ``x``).
        d_output: size of each output.
        bias: whether to add a learned bias. Default: True.
        initializer: how to fill the weight and the bias, both with ``fan_in = d_input``
            and ``fan_out = d_output``. Default: ``KaimingUniform(gain=1/sqrt(3))``,
            uniform on ``[-1/sqrt(d_input), 1/sqrt(d_input))`` as PyTorch does.

    Example:
        >>> import ember
        >>> from ember.nn import LinearConfig
        >>> layer = LinearConfig(4, 3).with_bias(False).init(ember.device("ndarray"))
        >>> layer.weight.shape, layer.bias
        ((4, 3), None)
    """

    d_input: PositiveInt
    d_output: PositiveInt
    bias: bool = True
    initializer: Initializer = KaimingUniform(gain=1 / math.sqrt(3))

    def init(self, device: Device | None = None) -> Linear:
        """A new :class:`Linear` with freshly initialized parameters on ``device``."""
        fans = {"fan_in": self.d_input, "fan_out": self.d_output}
        weight = self.initializer.init_param([self.d_input, self.d_output], device, **fans)
        bias = self.initializer.init_param([self.d_output], device, **fans) if self.bias else None
        return Linear(weight, bias)


class Linear(Module):
    """Applies ``y = x @ W + b`` to the last dim of the input.

    The weight is stored ``[d_input, d_output]``, as Burn stores it, so the forward
    pass is a plain matrix product. PyTorch's ``nn.Linear`` stores the transpose,
    ``[d_output, d_input]``; weights imported with the PyTorch adapter
    (``ember.record.adapter.PYTORCH``, used by ``PyTorchFileRecorder``) are
    transposed on load.

    Args:
        weight: ``[d_input, d_output]``.
        bias: ``[d_output]``, or None for no bias.

    Shape:
        - Input: ``[..., d_input]``, any rank >= 1.
        - Output: ``[..., d_output]``.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn import LinearConfig
        >>> device = ember.device("ndarray")
        >>> layer = LinearConfig(4, 3).init(device)
        >>> layer(Tensor.ones([2, 5, 4], device)).shape
        (2, 5, 3)
    """

    weight: Param
    bias: Param | None = None

    @property
    def d_input(self) -> int:
        return self.weight.shape[0]

    @property
    def d_output(self) -> int:
        return self.weight.shape[1]

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        if not shape or shape[-1] != self.d_input:
            raise ShapeError(
                f"Linear: expected an input of shape [..., {self.d_input}] (d_input), "
                f"got {fmt_shape(shape)}"
            )
        if len(shape) > 2:
            # [..., d_input] @ [d_input, d_output]: the backends multiply all leading rows
            # in one product, and a permuted input (attention's [seq, batch, dim]) where it
            # lies, where flattening it first would copy it.
            y = x.matmul(self.weight.val())
            return y if self.bias is None else y + self.bias.val()
        y = x.reshape([math.prod(shape[:-1]), self.d_input]).matmul(self.weight.val())
        if self.bias is not None:
            y = y + self.bias.val()
        return y.reshape([*shape[:-1], self.d_output])


def transposed(entry: Any) -> Any:
    """A record entry (a bare TensorData or ``{"id", "param"}``) with its matrix transposed.

    Entries that are not 2-d tensors are left as they are, for the loader to report.
    """
    if isinstance(entry, dict) and isinstance(entry.get("param"), TensorData):
        return {**entry, "param": transposed(entry["param"])}
    if isinstance(entry, TensorData) and entry.rank == 2:
        return TensorData._wrap(entry.to_numpy().T.copy())
    return entry


@PYTORCH.register(Linear)
def _from_pytorch(module: Linear, record: dict[str, Any]) -> dict[str, Any]:
    """PyTorch keeps Linear weights ``[d_output, d_input]``."""
    if "weight" in record:
        record["weight"] = transposed(record["weight"])
    return record
