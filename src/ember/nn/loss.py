"""Loss functions: cross entropy, binary cross entropy, MSE, Huber, smooth L1, KL divergence
and cosine embedding.

Each loss is a config and a module, as in Burn: ``CrossEntropyLossConfig().init(device)``
builds a :class:`CrossEntropyLoss` whose ``forward`` takes the predictions and the targets.
Every config has a ``reduction`` field: ``"mean"`` (the default, Burn's ``Reduction::Mean``
and ``Auto``), ``"sum"``, or ``"none"`` for one loss per element (per sample for the losses
that reduce over classes or features). The reduced losses are 0-d tensors.

Example:
    >>> import ember
    >>> from ember import Tensor
    >>> from ember.nn.loss import MseLossConfig
    >>> device = ember.device("ndarray")
    >>> loss = MseLossConfig().with_reduction("sum").init(device)
    >>> loss(Tensor.from_data([1.0, 2.0], device), Tensor.from_data([0.0, 0.0], device)).item()
    5.0
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field

from ember.backend.device import Device
from ember.backend.errors import ArgumentError, KindError, ShapeError, fmt_shape
from ember.config import Config
from ember.config.fields import AS_TUPLE, NonNegativeFloat, PositiveFloat, Probability
from ember.module import Module
from ember.nn._util import check_indices
from ember.tensor import Kind, Tensor
from ember.tensor.activation import log_sigmoid, log_softmax

Reduction = Literal["mean", "sum", "none"]
KLDivReduction = Literal["mean", "batchmean", "sum", "none"]

ClassWeights = Annotated[
    tuple[NonNegativeFloat, ...], Field(min_length=1), AS_TUPLE
]
PadTokens = Annotated[tuple[int, ...], AS_TUPLE]

# PyTorch's BCELoss clamps each log term at -100, so a saturated probability costs 100, not inf.
_LOG_FLOOR = -100.0
_PROB_FLOOR = math.exp(_LOG_FLOOR)
# Added to the squared norms in the cosine, as PyTorch's CosineEmbeddingLoss does.
_COSINE_EPS = 1e-12


# ------------------------------------------------------------------ shared checks and reductions
def _check_kind(loss: str, what: str, tensor: Tensor, *kinds: Kind) -> None:
    if tensor.kind not in kinds:
        allowed = " or ".join(kind.value for kind in kinds)
        raise KindError(f"{loss}: {what} must be {allowed}, got {tensor.kind.value}")


def _check_same_shape(loss: str, a_name: str, a: Tensor, b_name: str, b: Tensor) -> None:
    if a.shape != b.shape:
        raise ShapeError(
            f"{loss}: {b_name} must have the shape of the {a_name} {fmt_shape(a.shape)}, "
            f"got {fmt_shape(b.shape)}"
        )


def _reduce(loss_name: str, loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ArgumentError(
        f"{loss_name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}"
    )


def _constant(values: tuple[float, ...] | None, device: Device | None) -> Tensor | None:
    return None if values is None else Tensor.from_data(list(values), device)


def _beside(constant: Tensor, x: Tensor) -> Tensor:
    """``constant`` on the device and in the dtype of ``x`` (a loss built on one device works
    on another)."""
    if constant.device != x.device:
        constant = constant.to_device(x.device)
    return constant.cast(x.dtype)


# ------------------------------------------------------------------ cross entropy
class CrossEntropyLossConfig(Config):
    """Configuration of a :class:`CrossEntropyLoss`.

    Args:
        pad_tokens: target values to ignore (padding), like PyTorch's ``ignore_index``
            but several are allowed. Default: None.
        weights: one non-negative weight per class (PyTorch's ``weight``). Default: None.
        smoothing: label smoothing in ``[0, 1]``: the target distribution is
            ``(1 - smoothing) * one_hot + smoothing / classes``. Default: None.
        logits: whether the inputs are logits (True, log-softmax is applied) or
            probabilities (False, their log is taken). Default: True.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``. Default: ``"mean"``.

    Example:
        >>> import ember
        >>> from ember.nn.loss import CrossEntropyLossConfig
        >>> config = CrossEntropyLossConfig(pad_tokens=[0], smoothing=0.1)
        >>> loss = config.init(ember.device("ndarray"))
        >>> loss.pad_tokens, loss.smoothing, loss.reduction
        ((0,), 0.1, 'mean')
    """

    pad_tokens: PadTokens | None = None
    weights: ClassWeights | None = None
    smoothing: Probability | None = None
    logits: bool = True
    reduction: Reduction = "mean"

    def init(self, device: Device | None = None) -> CrossEntropyLoss:
        """A :class:`CrossEntropyLoss` whose class weights live on ``device``."""
        return CrossEntropyLoss(
            pad_tokens=self.pad_tokens,
            weights=_constant(self.weights, device),
            smoothing=self.smoothing,
            logits=self.logits,
            reduction=self.reduction,
        )


class CrossEntropyLoss(Module):
    """Cross entropy between class scores and integer class targets.

    The loss of a sample with target ``t`` is ``-sum_c w_c q_c log p_c``, where ``p`` is
    the softmax of the logits (or the given probabilities), ``q`` the one-hot target
    (smoothed if asked) and ``w`` the class weights (all 1 without weights); without
    smoothing it is ``-w_t log p_t``. The log-softmax is shifted by the row maximum, so
    extreme logits give finite losses and gradients.

    Samples whose target is a pad token count for nothing. ``"mean"`` divides the sum by
    the number of counted samples, or with class weights by the sum of their targets'
    weights, as PyTorch does. When every target is padding the mean is 0 with zero
    gradients, where PyTorch returns NaN.

    Burn's loss returns the mean over the whole batch, padding included; ember follows
    PyTorch's mean over the counted samples. Targets must lie in ``[0, classes)``
    unless they are pad tokens; they are not checked, so that the loss needs no
    synchronization with the device.

    Args:
        pad_tokens: ignored target values, or None.
        weights: class weights ``[classes]``, or None.
        smoothing: label smoothing in ``[0, 1]``, or None.
        logits: whether the inputs are logits or probabilities.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    Shape:
        - Logits: ``[batch, classes]``, Float.
        - Targets: ``[batch]``, Int class indices.
        - Output: ``[]``, or ``[batch]`` with ``reduction="none"``.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.loss import CrossEntropyLossConfig
        >>> device = ember.device("ndarray")
        >>> loss = CrossEntropyLossConfig(pad_tokens=[2]).init(device)
        >>> logits = Tensor.from_data([[0.0, 0.0], [5.0, 1.0]], device)
        >>> round(loss(logits, Tensor.from_data([1, 2], device)).item(), 4)  # log(2)
        0.6931
    """

    pad_tokens: tuple[int, ...] | None = None
    weights: Tensor | None = None
    smoothing: float | None = None
    logits: bool = True
    reduction: str = "mean"

    def forward(self, logits: Tensor, targets: Tensor) -> Tensor:
        self._check(logits, targets)
        batch, classes = logits.shape

        ignored = None
        for token in self.pad_tokens or ():
            hit = targets.equal(token)
            ignored = hit if ignored is None else ignored.bool_or(hit)
        if ignored is not None:  # any valid class keeps gather in range; the loss is masked
            targets = targets.mask_fill(ignored, 0)
        check_indices("CrossEntropyLoss", "targets (class indices)", targets, classes)

        weights = None if self.weights is None else _beside(self.weights, logits)
        target_weights = None if weights is None else weights.gather(0, targets)
        if self.smoothing:
            log_p = log_softmax(logits, 1) if self.logits else logits.log()
            q = targets.one_hot(classes).cast(log_p.dtype) * (1.0 - self.smoothing)
            q = q + self.smoothing / classes
            if weights is not None:
                q = q * weights.reshape([1, classes])
            loss = -(log_p * q).sum_dim(1).reshape([batch])
        else:
            index = targets.reshape([batch, 1])
            if self.logits:
                picked = log_softmax(logits, 1).gather(1, index)
            else:
                # The log of the targets' probabilities only: a zero probability elsewhere, or
                # in a padded row, would otherwise turn its zero gradient into 0 / 0.
                picked = logits.gather(1, index)
                if ignored is not None:
                    picked = picked.mask_fill(ignored.reshape([batch, 1]), 1.0)
                picked = picked.log()
            loss = -picked.reshape([batch])
            if target_weights is not None:
                loss = loss * target_weights
        if ignored is not None:
            loss = loss.mask_fill(ignored, 0.0)

        if self.reduction != "mean" or (ignored is None and target_weights is None):
            return _reduce("CrossEntropyLoss", loss, self.reduction)
        if target_weights is not None:
            counted = target_weights if ignored is None else target_weights.mask_fill(ignored, 0.0)
            total = counted.sum()
        else:
            total = ignored.bool_not().cast(loss.dtype).sum()
        if ignored is not None:  # nothing counted: 0 / 1 rather than PyTorch's 0 / 0
            total = total.mask_fill(ignored.all(), 1.0)
        return loss.sum() / total

    def _check(self, logits: Tensor, targets: Tensor) -> None:
        name = "CrossEntropyLoss"
        _check_kind(name, "logits", logits, Kind.FLOAT)
        _check_kind(name, "targets (class indices)", targets, Kind.INT)
        if logits.rank != 2:
            raise ShapeError(
                f"{name}: expected logits of shape [batch, classes], got {fmt_shape(logits.shape)}"
            )
        if targets.shape != logits.shape[:1]:
            raise ShapeError(
                f"{name}: expected targets of shape [{logits.shape[0]}] (the batch of the "
                f"logits {fmt_shape(logits.shape)}), got {fmt_shape(targets.shape)}"
            )
        if self.weights is not None and self.weights.shape != logits.shape[1:]:
            raise ShapeError(
                f"{name}: got {self.weights.shape[0]} class weights for logits with "
                f"{logits.shape[1]} classes {fmt_shape(logits.shape)}"
            )


# ------------------------------------------------------------------ binary cross entropy
class BinaryCrossEntropyLossConfig(Config):
    """Configuration of a :class:`BinaryCrossEntropyLoss`.

    Args:
        weights: class weights: for ``[batch]`` targets two, for class 0 and class 1;
            for ``[..., labels]`` targets one per label (the last dim). Default: None.
        smoothing: label smoothing in ``[0, 1]``: targets become
            ``(1 - smoothing) * t + smoothing / 2``. Default: None.
        logits: whether the inputs are logits (True, stable like PyTorch's
            ``BCEWithLogitsLoss``) or probabilities (False, the default in Burn).
            Default: False.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``. Default: ``"mean"``.

    Example:
        >>> import ember
        >>> from ember.nn.loss import BinaryCrossEntropyLossConfig
        >>> loss = BinaryCrossEntropyLossConfig(weights=[1.0, 3.0]).init(ember.device("ndarray"))
        >>> loss.weights.tolist(), loss.logits
        ([1.0, 3.0], False)
    """

    weights: ClassWeights | None = None
    smoothing: Probability | None = None
    logits: bool = False
    reduction: Reduction = "mean"

    def init(self, device: Device | None = None) -> BinaryCrossEntropyLoss:
        """A :class:`BinaryCrossEntropyLoss` whose class weights live on ``device``."""
        return BinaryCrossEntropyLoss(
            weights=_constant(self.weights, device),
            smoothing=self.smoothing,
            logits=self.logits,
            reduction=self.reduction,
        )


class BinaryCrossEntropyLoss(Module):
    """Binary cross entropy ``-(t log p + (1 - t) log(1 - p))`` per element.

    With ``logits=True`` it is computed as ``(1 - t) x - log_sigmoid(x)``, finite for
    any logit. With probabilities each log is clamped at -100, as PyTorch's ``BCELoss``
    does; where the clamp holds (a probability of exactly 0 or 1) the gradient is 0,
    where PyTorch gives a large finite value.

    Targets are Int (0 or 1) or Float (soft targets in ``[0, 1]``). Class weights
    multiply each element's loss: with ``[batch]`` targets the weight of its class
    (which needs Int targets), with ``[..., labels]`` targets the weight of its label.
    The mean divides by the number of elements, as PyTorch does with ``weight``.

    Burn defaults to probabilities (``logits=False``), unlike PyTorch's usual choice of
    ``BCEWithLogitsLoss``.

    Args:
        weights: class weights, or None.
        smoothing: label smoothing in ``[0, 1]``, or None.
        logits: whether the inputs are logits or probabilities.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    Shape:
        - Logits: ``[batch]`` or ``[..., labels]``, Float.
        - Targets: the shape of the logits, Int or Float.
        - Output: ``[]``, or the shape of the logits with ``reduction="none"``.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.loss import BinaryCrossEntropyLossConfig
        >>> device = ember.device("ndarray")
        >>> loss = BinaryCrossEntropyLossConfig(logits=True, reduction="none").init(device)
        >>> x = Tensor.from_data([0.0, 200.0], device)
        >>> [round(v, 4) for v in loss(x, Tensor.from_data([1, 0], device)).tolist()]
        [0.6931, 200.0]
    """

    weights: Tensor | None = None
    smoothing: float | None = None
    logits: bool = False
    reduction: str = "mean"

    def forward(self, logits: Tensor, targets: Tensor) -> Tensor:
        self._check(logits, targets)
        t = targets.cast(logits.dtype)
        if self.smoothing:
            t = t * (1.0 - self.smoothing) + self.smoothing / 2
        if self.logits:
            loss = (1.0 - t) * logits - log_sigmoid(logits)
        else:
            loss = -(t * _clamped_log(logits) + (1.0 - t) * _clamped_log(1.0 - logits))
        if self.weights is not None:
            weights = _beside(self.weights, loss)
            if logits.rank == 1:
                weights = weights.gather(0, targets)  # per sample: its class's weight
            loss = loss * weights
        return _reduce("BinaryCrossEntropyLoss", loss, self.reduction)

    def _check(self, logits: Tensor, targets: Tensor) -> None:
        name = "BinaryCrossEntropyLoss"
        _check_kind(name, "logits", logits, Kind.FLOAT)
        _check_kind(name, "targets", targets, Kind.INT, Kind.FLOAT)
        if logits.rank == 0:
            raise ShapeError(f"{name}: expected logits of shape [batch] or [..., labels], got []")
        _check_same_shape(name, "logits", logits, "targets", targets)
        if self.weights is None:
            return
        count = self.weights.shape[0]
        if logits.rank == 1:
            if count != 2:
                raise ShapeError(
                    f"{name}: [batch] targets take 2 class weights (class 0 and class 1), "
                    f"got {count}"
                )
            if targets.kind is not Kind.INT:
                raise KindError(
                    f"{name}: class weights for [batch] targets are picked by the target class, "
                    f"so the targets must be Int, got {targets.kind.value}"
                )
        elif count != logits.shape[-1]:
            raise ShapeError(
                f"{name}: got {count} class weights for logits {fmt_shape(logits.shape)} with "
                f"{logits.shape[-1]} labels (the last dim)"
            )


def _clamped_log(p: Tensor) -> Tensor:
    """``max(log p, -100)``, with zero gradients where the floor holds (no 0 * inf)."""
    floor = p.lower_equal(_PROB_FLOOR)
    return p.mask_fill(floor, 1.0).log().mask_fill(floor, _LOG_FLOOR)


# ------------------------------------------------------------------ regression losses
class MseLossConfig(Config):
    """Configuration of a :class:`MseLoss`.

    Args:
        reduction: ``"mean"``, ``"sum"`` or ``"none"``. Default: ``"mean"``.

    Example:
        >>> from ember.nn.loss import MseLossConfig
        >>> MseLossConfig().init().reduction
        'mean'
    """

    reduction: Reduction = "mean"

    def init(self, device: Device | None = None) -> MseLoss:
        """A :class:`MseLoss` (it holds no tensors: ``device`` is accepted for symmetry)."""
        return MseLoss(self.reduction)


class MseLoss(Module):
    """Mean squared error: ``(predictions - targets)^2`` per element.

    Unlike PyTorch, the shapes must be equal (no broadcasting of the targets).

    Args:
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    Shape:
        - Predictions: any shape, Float.
        - Targets: the shape of the predictions, Float.
        - Output: ``[]``, or the shape of the predictions with ``reduction="none"``.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.loss import MseLossConfig
        >>> device = ember.device("ndarray")
        >>> x, y = Tensor.from_data([1.0, 3.0], device), Tensor.from_data([0.0, 0.0], device)
        >>> MseLossConfig().init(device)(x, y).item()
        5.0
    """

    reduction: str = "mean"

    def forward(self, predictions: Tensor, targets: Tensor) -> Tensor:
        diff = _difference("MseLoss", predictions, targets)
        return _reduce("MseLoss", diff * diff, self.reduction)


def _difference(name: str, predictions: Tensor, targets: Tensor) -> Tensor:
    _check_kind(name, "predictions", predictions, Kind.FLOAT)
    _check_kind(name, "targets", targets, Kind.FLOAT)
    _check_same_shape(name, "predictions", predictions, "targets", targets)
    return predictions - targets


def _huber(diff: Tensor, delta: float) -> Tensor:
    """``d^2 / 2`` for ``|d| < delta``, ``delta (|d| - delta / 2)`` beyond, without branches:
    the clamped part is quadratic and the rest grows linearly."""
    size = diff.abs()
    inner = size.clamp_max(delta)
    return inner * inner * 0.5 + (size - inner) * delta


class HuberLossConfig(Config):
    """Configuration of a :class:`HuberLoss`.

    Args:
        delta: where the loss turns from quadratic to linear; positive. Burn requires it;
            PyTorch defaults to 1.0.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``. Default: ``"mean"``.

    Example:
        >>> from ember.nn.loss import HuberLossConfig
        >>> HuberLossConfig(0.5).init().delta
        0.5
    """

    delta: PositiveFloat
    reduction: Reduction = "mean"

    def init(self, device: Device | None = None) -> HuberLoss:
        """A :class:`HuberLoss` (it holds no tensors: ``device`` is accepted for symmetry)."""
        return HuberLoss(self.delta, self.reduction)


class HuberLoss(Module):
    """Huber loss: quadratic for small errors, linear for large ones.

    Per element, with ``d = predictions - targets``: ``d^2 / 2`` where ``|d| < delta``,
    else ``delta * (|d| - delta / 2)``. The shapes must be equal.

    Args:
        delta: the threshold between the quadratic and the linear part.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    Shape:
        - Predictions: any shape, Float.
        - Targets: the shape of the predictions, Float.
        - Output: ``[]``, or the shape of the predictions with ``reduction="none"``.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.loss import HuberLossConfig
        >>> device = ember.device("ndarray")
        >>> loss = HuberLossConfig(1.0, reduction="none").init(device)
        >>> loss(Tensor.from_data([0.5, 3.0], device), Tensor.zeros([2], device)).tolist()
        [0.125, 2.5]
    """

    delta: float
    reduction: str = "mean"

    def forward(self, predictions: Tensor, targets: Tensor) -> Tensor:
        diff = _difference("HuberLoss", predictions, targets)
        return _reduce("HuberLoss", _huber(diff, self.delta), self.reduction)


class SmoothL1LossConfig(Config):
    """Configuration of a :class:`SmoothL1Loss`.

    Args:
        beta: where the loss turns from quadratic to linear; 0 gives the L1 loss.
            Default: 1.0.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``. Default: ``"mean"``.

    Example:
        >>> from ember.nn.loss import SmoothL1LossConfig
        >>> SmoothL1LossConfig().init().beta
        1.0
    """

    beta: NonNegativeFloat = 1.0
    reduction: Reduction = "mean"

    def init(self, device: Device | None = None) -> SmoothL1Loss:
        """A :class:`SmoothL1Loss` (it holds no tensors: ``device`` is accepted for symmetry)."""
        return SmoothL1Loss(self.beta, self.reduction)


class SmoothL1Loss(Module):
    """Smooth L1 loss: the Huber loss with ``delta = beta``, divided by ``beta``.

    Per element, with ``d = predictions - targets``: ``d^2 / (2 beta)`` where
    ``|d| < beta``, else ``|d| - beta / 2``; with ``beta = 0`` simply ``|d|``. The
    slope of the linear part is 1 for every ``beta`` (PyTorch's ``SmoothL1Loss``).

    Args:
        beta: the threshold between the quadratic and the linear part.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    Shape:
        - Predictions: any shape, Float.
        - Targets: the shape of the predictions, Float.
        - Output: ``[]``, or the shape of the predictions with ``reduction="none"``.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.loss import SmoothL1LossConfig
        >>> device = ember.device("ndarray")
        >>> loss = SmoothL1LossConfig(beta=2.0, reduction="none").init(device)
        >>> loss(Tensor.from_data([1.0, 3.0], device), Tensor.zeros([2], device)).tolist()
        [0.25, 2.0]
    """

    beta: float = 1.0
    reduction: str = "mean"

    def forward(self, predictions: Tensor, targets: Tensor) -> Tensor:
        diff = _difference("SmoothL1Loss", predictions, targets)
        loss = diff.abs() if self.beta == 0 else _huber(diff, self.beta) / self.beta
        return _reduce("SmoothL1Loss", loss, self.reduction)


# ------------------------------------------------------------------ KL divergence
class KLDivLossConfig(Config):
    """Configuration of a :class:`KLDivLoss`.

    Args:
        log_target: whether the targets are log-probabilities (True) or
            probabilities (False). Default: False.
        reduction: ``"batchmean"`` (the sum divided by the batch size, dim 0: the true
            KL divergence per sample), ``"mean"`` (over every element), ``"sum"`` or
            ``"none"``. Default: ``"batchmean"``, where PyTorch defaults to ``"mean"``.

    Example:
        >>> from ember.nn.loss import KLDivLossConfig
        >>> KLDivLossConfig().init().reduction
        'batchmean'
    """

    log_target: bool = False
    reduction: KLDivReduction = "batchmean"

    def init(self, device: Device | None = None) -> KLDivLoss:
        """A :class:`KLDivLoss` (it holds no tensors: ``device`` is accepted for symmetry)."""
        return KLDivLoss(self.log_target, self.reduction)


class KLDivLoss(Module):
    """Kullback-Leibler divergence ``KL(targets || predictions)`` from log-probabilities.

    Per element, with ``x`` the predicted log-probabilities and ``t`` the target
    probabilities: ``t * (log t - x)``, taken as 0 where ``t = 0``. With
    ``log_target=True`` the targets are log-probabilities ``l`` and the element is
    ``e^l * (l - x)``. The shapes must be equal.

    Args:
        log_target: whether the targets are log-probabilities.
        reduction: ``"batchmean"``, ``"mean"``, ``"sum"`` or ``"none"``.

    Shape:
        - Log-probabilities: ``[batch, ...]``, Float.
        - Targets: the shape of the log-probabilities, Float.
        - Output: ``[]``, or the input's shape with ``reduction="none"``.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.loss import KLDivLossConfig
        >>> device = ember.device("ndarray")
        >>> log_p = Tensor.from_data([[0.5, 0.5]], device).log()
        >>> t = Tensor.from_data([[1.0, 0.0]], device)
        >>> round(KLDivLossConfig().init(device)(log_p, t).item(), 4)  # log(2)
        0.6931
    """

    log_target: bool = False
    reduction: str = "batchmean"

    def forward(self, log_probs: Tensor, targets: Tensor) -> Tensor:
        name = "KLDivLoss"
        _check_kind(name, "log-probabilities", log_probs, Kind.FLOAT)
        _check_kind(name, "targets", targets, Kind.FLOAT)
        _check_same_shape(name, "log-probabilities", log_probs, "targets", targets)
        if self.log_target:
            loss = targets.exp() * (targets - log_probs)
        else:
            empty = targets.equal(0.0)  # 0 log 0 = 0: log(1) keeps the gradient finite
            loss = targets * (targets.mask_fill(empty, 1.0).log() - log_probs)
        if self.reduction == "batchmean":
            batch = log_probs.shape[0] if log_probs.rank else 1
            return loss.sum() / batch
        return _reduce(name, loss, self.reduction)


# ------------------------------------------------------------------ cosine embedding
class CosineEmbeddingLossConfig(Config):
    """Configuration of a :class:`CosineEmbeddingLoss`.

    Args:
        margin: dissimilar pairs cost nothing once their cosine is at most ``margin``;
            in ``[-1, 1]``. Default: 0.0.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``. Default: ``"mean"``.

    Example:
        >>> from ember.nn.loss import CosineEmbeddingLossConfig
        >>> CosineEmbeddingLossConfig(margin=0.5).init().margin
        0.5
    """

    margin: Annotated[float, Field(ge=-1, le=1)] = 0.0
    reduction: Reduction = "mean"

    def init(self, device: Device | None = None) -> CosineEmbeddingLoss:
        """A :class:`CosineEmbeddingLoss` (it holds no tensors: ``device`` is accepted for
        symmetry)."""
        return CosineEmbeddingLoss(self.margin, self.reduction)


class CosineEmbeddingLoss(Module):
    """Pulls similar pairs of embeddings together and pushes dissimilar ones apart.

    With ``cos`` the cosine similarity of a pair, the loss is ``1 - cos`` for target 1
    and ``max(0, cos - margin)`` for target -1; other target values cost 0, as in
    PyTorch. The squared norms get ``1e-12`` added, so zero vectors give finite values.

    Args:
        margin: the cosine below which dissimilar pairs cost nothing.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    Shape:
        - Inputs: ``[batch, features]`` each (or ``[features]`` for one pair), Float.
        - Targets: ``[batch]`` (``[]`` for one pair), Int or Float, 1 or -1.
        - Output: ``[]``, or ``[batch]`` with ``reduction="none"``.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.loss import CosineEmbeddingLossConfig
        >>> device = ember.device("ndarray")
        >>> loss = CosineEmbeddingLossConfig(reduction="none").init(device)
        >>> a = Tensor.from_data([[1.0, 0.0], [1.0, 0.0]], device)
        >>> b = Tensor.from_data([[0.0, 1.0], [1.0, 1.0]], device)
        >>> [round(v, 4) for v in loss(a, b, Tensor.from_data([1, -1], device)).tolist()]
        [1.0, 0.7071]
    """

    margin: float = 0.0
    reduction: str = "mean"

    def forward(self, x1: Tensor, x2: Tensor, targets: Tensor) -> Tensor:
        self._check(x1, x2, targets)
        dot = (x1 * x2).sum_dim(-1)
        norms = ((x1 * x1).sum_dim(-1) + _COSINE_EPS) * ((x2 * x2).sum_dim(-1) + _COSINE_EPS)
        cos = (dot / norms.sqrt()).reshape(targets.shape)
        similar = (1.0 - cos).mask_fill(targets.not_equal(1), 0.0)
        dissimilar = (cos - self.margin).clamp_min(0.0).mask_fill(targets.not_equal(-1), 0.0)
        return _reduce("CosineEmbeddingLoss", similar + dissimilar, self.reduction)

    def _check(self, x1: Tensor, x2: Tensor, targets: Tensor) -> None:
        name = "CosineEmbeddingLoss"
        _check_kind(name, "x1", x1, Kind.FLOAT)
        _check_kind(name, "x2", x2, Kind.FLOAT)
        _check_kind(name, "targets", targets, Kind.INT, Kind.FLOAT)
        if x1.rank not in (1, 2):
            raise ShapeError(
                f"{name}: expected inputs of shape [batch, features] or [features], "
                f"got {fmt_shape(x1.shape)}"
            )
        _check_same_shape(name, "x1", x1, "x2", x2)
        if targets.shape != x1.shape[:-1]:
            raise ShapeError(
                f"{name}: expected targets of shape {fmt_shape(x1.shape[:-1])} (one per pair of "
                f"the inputs {fmt_shape(x1.shape)}), got {fmt_shape(targets.shape)}"
            )
