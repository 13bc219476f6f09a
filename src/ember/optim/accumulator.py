"""GradientsAccumulator: sums gradients over several backward passes before one step."""

from __future__ import annotations

from ember.backend.errors import ArgumentError
from ember.module import Module
from ember.optim.grads import GradientsParams, check_grad_shape


class GradientsAccumulator:
    """Adds up the gradients of a module's parameters across backward passes.

    Useful for batches too large for one pass: run the forward and backward pass on
    each part, :meth:`accumulate` the gradients, then step once with :meth:`grads`.
    Since gradients are linear, the sum equals the gradient of the summed losses.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.linear import LinearConfig
        >>> from ember.optim.accumulator import GradientsAccumulator
        >>> from ember.optim.grads import GradientsParams
        >>> device = ember.device("ndarray").autodiff()
        >>> model = LinearConfig(2, 1).init(device)
        >>> accumulator = GradientsAccumulator()
        >>> for _ in range(3):
        ...     grads = model(Tensor.ones([1, 2], device)).sum().backward()
        ...     accumulator.accumulate(model, GradientsParams.from_grads(grads, model))
        >>> accumulator.grads().get(model.bias.id).tolist()
        [3.0]
        >>> len(accumulator.grads())  # grads() starts a new sum
        0
    """

    __slots__ = ("_sum",)

    def __init__(self) -> None:
        self._sum = GradientsParams()

    def accumulate(self, module: Module, grads: GradientsParams) -> None:
        """Adds the gradients of ``module``'s trainable parameters in ``grads`` to the sum.

        Gradients of ids that are not ``module``'s parameters are ignored.

        Raises:
            ArgumentError: ``module`` is not a Module or ``grads`` not a GradientsParams.
            ShapeError: a gradient whose shape is not its parameter's.
        """
        if not isinstance(module, Module):
            raise ArgumentError(
                f"GradientsAccumulator.accumulate: expected a Module, got {type(module).__name__}"
            )
        if not isinstance(grads, GradientsParams):
            raise ArgumentError(
                "GradientsAccumulator.accumulate: expected a GradientsParams "
                f"(GradientsParams.from_grads(loss.backward(), model)), got {type(grads).__name__}"
            )
        for path, param in module.params():
            grad = grads.get(param.id)
            if grad is None or not param.require_grad:
                continue
            check_grad_shape("GradientsAccumulator.accumulate", path, grad, param.shape)
            total = self._sum.get(param.id)
            # Parts of one batch may run on different devices: the sum stays where it started.
            self._sum.register(
                param.id, grad if total is None else total + grad.to_device(total.device)
            )

    def grads(self) -> GradientsParams:
        """The accumulated gradients; the accumulator starts again from zero."""
        found, self._sum = self._sum, GradientsParams()
        return found

    def __repr__(self) -> str:
        return f"GradientsAccumulator({len(self._sum)} tensors)"
