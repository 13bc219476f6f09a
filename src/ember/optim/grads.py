"""GradientsParams: the gradients of one or more backward passes, keyed by parameter id.

``loss.backward()`` gives a :class:`~ember.backends.autodiff.graph.Gradients`
keyed by graph node, which only the graph that made it understands. An
optimizer needs gradients it can match with parameters across graphs, devices
and module copies, so :meth:`GradientsParams.from_grads` re-keys them by each
parameter's :class:`~ember.module.ParamId`, which every module copy keeps.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ember.backend.device import Device
from ember.backend.errors import ArgumentError, DeviceError, ShapeError, fmt_shape
from ember.backends.autodiff.graph import Gradients
from ember.module import Module, ParamId
from ember.tensor import Tensor


class GradientsParams:
    """Gradients keyed by :class:`~ember.module.ParamId`, each a tensor on an inner device.

    Build one from a backward pass with :meth:`from_grads`; an optimizer's ``step``
    reads the gradient of each parameter it updates. The container is a plain
    mapping: :meth:`register` adds, :meth:`remove` takes out, :meth:`get` reads.

    Args:
        grads: initial gradients, ``{ParamId: Tensor}``. Default: none.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.linear import LinearConfig
        >>> from ember.optim.grads import GradientsParams
        >>> device = ember.device("ndarray").autodiff()
        >>> model = LinearConfig(3, 2).init(device)
        >>> loss = model(Tensor.ones([4, 3], device)).sum()
        >>> grads = GradientsParams.from_grads(loss.backward(), model)
        >>> len(grads), grads.get(model.bias.id).tolist()
        (2, [4.0, 4.0])
    """

    __slots__ = ("_grads",)

    def __init__(self, grads: dict[ParamId, Tensor] | None = None) -> None:
        self._grads: dict[ParamId, Tensor] = {}
        for param_id, grad in (grads or {}).items():
            self.register(param_id, grad)

    @staticmethod
    def from_grads(grads: Gradients, module: Module) -> GradientsParams:
        """The gradients of ``module``'s trainable parameters found in ``grads``.

        Parameters without ``require_grad`` (and running states) are left out, as
        are parameters the backward pass did not reach. ``grads`` is left as it was.

        Args:
            grads: what ``loss.backward()`` returned.
            module: the module whose parameters ``loss`` was computed from.

        Raises:
            ArgumentError: ``grads`` is not a Gradients or ``module`` not a Module.
            DeviceError: a trainable parameter is not on an autodiff device.
        """
        return GradientsParams.from_params(grads, module, None)

    @staticmethod
    def from_params(
        grads: Gradients, module: Module, ids: Iterable[ParamId] | None
    ) -> GradientsParams:
        """Like :meth:`from_grads`, keeping only the parameters whose ids are in ``ids``.

        ``ids`` of None keeps every trainable parameter; this lets parts of one model
        be trained by different optimizers.
        """
        if not isinstance(grads, Gradients):
            raise ArgumentError(
                f"GradientsParams.from_grads: expected the Gradients that backward() returns, "
                f"got {type(grads).__name__}"
            )
        if not isinstance(module, Module):
            raise ArgumentError(
                f"GradientsParams.from_grads: expected a Module, got {type(module).__name__}"
            )
        wanted = None if ids is None else set(ids)
        found = GradientsParams()
        for path, param in module.params():
            if not param.require_grad or (wanted is not None and param.id not in wanted):
                continue
            value = param.val()
            if not hasattr(value.device.backend, "backward"):
                raise DeviceError(
                    f"GradientsParams.from_grads: parameter {path} is on {value.device}, which "
                    "has no autodiff; gradients come from a module on an autodiff device"
                )
            grad = value.grad(grads)
            if grad is not None:
                found._grads[param.id] = grad
        return found

    def get(self, param_id: ParamId) -> Tensor | None:
        """The gradient of the parameter ``param_id``; None if it has none."""
        return self._grads.get(param_id)

    def remove(self, param_id: ParamId) -> Tensor | None:
        """Takes the gradient of ``param_id`` out; None if it has none."""
        return self._grads.pop(param_id, None)

    def register(self, param_id: ParamId, grad: Tensor) -> None:
        """Sets the gradient of ``param_id`` (replacing any it had).

        Raises:
            ArgumentError: ``param_id`` is not a ParamId or ``grad`` not a Float tensor.
        """
        if not isinstance(param_id, ParamId):
            raise ArgumentError(
                f"GradientsParams.register: expected a ParamId, got {type(param_id).__name__}"
            )
        if not isinstance(grad, Tensor) or not grad.dtype.is_float:
            got = grad.dtype.value if isinstance(grad, Tensor) else type(grad).__name__
            raise ArgumentError(
                f"GradientsParams.register: the gradient of {param_id} must be a Float tensor, "
                f"got {got}"
            )
        self._grads[param_id] = grad

    def ids(self) -> list[ParamId]:
        """The ids that have a gradient."""
        return list(self._grads)

    def to_device(self, device: Device) -> GradientsParams:
        """The same gradients on ``device`` (a new container)."""
        return GradientsParams({pid: grad.to_device(device) for pid, grad in self._grads.items()})

    def is_empty(self) -> bool:
        return not self._grads

    def __len__(self) -> int:
        return len(self._grads)

    def __contains__(self, param_id: object) -> bool:
        return param_id in self._grads

    def __iter__(self) -> Iterator[ParamId]:
        return iter(self._grads)

    def __repr__(self) -> str:
        return f"GradientsParams({len(self._grads)} tensors)"


def check_grad_shape(owner: str, path: str, grad: Tensor, shape: tuple[int, ...]) -> None:
    """Raises ShapeError when a gradient does not have its parameter's shape."""
    if grad.shape != shape:
        raise ShapeError(
            f"{owner}: the gradient of parameter {path} has shape {fmt_shape(grad.shape)}, "
            f"the parameter {fmt_shape(shape)}"
        )
