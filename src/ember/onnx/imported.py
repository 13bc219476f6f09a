"""ImportedModel: the base class of the modules ONNX import generates, whose calls replay.

An ONNX graph is fixed when it is imported: the generated ``forward`` is straight-line
code whose ops depend only on its inputs' shapes and dtypes, never on their values
(a graph that reads a value, an ``If`` on a computed condition say, is found out and runs
plainly). That is exactly what :func:`ember.backends.fusion.replay` needs, so on a fusion
device calling an imported model replays it: the first call of an input signature runs
plainly, the second traces, and later ones push the traced ops without the Python that
made them, running the same launches at once (the ONNX encoder of
``benchmarks/onnx_inference.py`` at two threads: 26 ms a call recorded op by op, 21
replayed). The model itself is an argument of the replayed function, so its parameters
are inputs of the trace: a model with other weights (a new module from ``load_record``
or an optimizer's step) runs with its own.

``model.forward(x)`` runs the ops as they are recorded, every call;
``EMBER_FUSION_REPLAY=0`` turns replaying off everywhere. On any other device, an
autodiff one included (a model being trained returns outputs gradients flow through, which
a replay does not make), a call is ``forward``.

Example:
    >>> import ember
    >>> from ember import Tensor
    >>> from ember.onnx.imported import ImportedModel
    >>> class Doubled(ImportedModel):
    ...     def forward(self, x: Tensor) -> Tensor:
    ...         return x * 2.0
    >>> device = ember.device("ndarray").fusion()
    >>> model = Doubled()
    >>> [model(Tensor.from_data([1.0, 2.0], device)).tolist() for _ in range(3)]
    [[2.0, 4.0], [2.0, 4.0], [2.0, 4.0]]
"""

from __future__ import annotations

from typing import Any, ClassVar

from ember.module import Module
from ember.tensor import Tensor

__all__ = ["ImportedModel"]


def _forward(model: ImportedModel, *inputs: Any, **kwargs: Any) -> Any:
    return model.forward(*inputs, **kwargs)


class ImportedModel(Module):
    """A module generated from an ONNX graph: calling it replays ``forward`` on a fusion
    device (see the module's documentation), and is ``forward`` elsewhere."""

    _replayed: ClassVar[Any] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._replayed = None  # each model class keeps its own traces, made on first use

    def __call__(self, *inputs: Any, **kwargs: Any) -> Any:
        first = next((x for x in inputs if isinstance(x, Tensor)), None)
        if first is None or not _on_fusion(first):
            return self.forward(*inputs, **kwargs)
        cls = type(self)
        if cls._replayed is None:
            from ember.backends.fusion import replay

            cls._replayed = replay(_forward)
        return cls._replayed(self, *inputs, **kwargs)


def _on_fusion(tensor: Tensor) -> bool:
    """Whether ``tensor`` is on a lazy fusion backend itself: under Autodiff a model trains,
    and its outputs, which gradients flow through, are not replayable."""
    from ember.backends.fusion.replayed import fusion_of

    backend = tensor._device.backend
    return fusion_of(backend) is backend
