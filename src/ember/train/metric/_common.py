"""What the built-in metrics share: reading their inputs back once, and formatting entries."""

from __future__ import annotations

import numpy as np

from ember.backend.errors import EmberIndexError, KindError, ShapeError, fmt_shape
from ember.tensor import Tensor
from ember.tensor.dtype import Kind


def read(owner: str, what: str, tensor: Tensor, rank: int, kinds: tuple[Kind, ...]) -> np.ndarray:
    """The elements of ``tensor`` on the host (one transfer), after checking rank and kind.

    Float tensors come back as float64, whatever their dtype (f16 and bf16 included).
    """
    if tensor.kind not in kinds:
        allowed = " or ".join(k.value for k in kinds)
        raise KindError(f"{owner}: {what} must be {allowed} tensors, got {tensor.kind.value}")
    if tensor.rank != rank:
        raise ShapeError(
            f"{owner}: {what} must have rank {rank}, got shape {fmt_shape(tensor.shape)}"
        )
    array = np.asarray(tensor.to_numpy())
    return array.astype(np.float64) if tensor.kind is Kind.FLOAT else array


def check_batch(owner: str, outputs: np.ndarray, targets: np.ndarray, what: str) -> None:
    """Outputs and targets must describe the same, non-empty batch."""
    if outputs.shape[0] != targets.shape[0]:
        raise ShapeError(
            f"{owner}: outputs {fmt_shape(outputs.shape)} and {what} {fmt_shape(targets.shape)} "
            "have different batch sizes"
        )
    if outputs.shape[0] == 0:
        raise ShapeError(f"{owner}: the batch is empty (outputs {fmt_shape(outputs.shape)})")


def check_classes(owner: str, targets: np.ndarray, num_classes: int,
                  ignore: int | None = None) -> None:  # fmt: skip
    """Every target (but the ignored pad token) must be a class index of the outputs."""
    counted = targets if ignore is None else targets[targets != ignore]
    if counted.size and (counted.min() < 0 or counted.max() >= num_classes):
        raise EmberIndexError(
            f"{owner}: targets must be class indices in [0, {num_classes}), "
            f"got {counted.min()} to {counted.max()}"
        )


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """The indices of the ``k`` largest scores of each row, ties broken towards lower indices.

    A stable sort keeps equal scores in index order, so ``k=1`` agrees with ``argmax``.
    """
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]
