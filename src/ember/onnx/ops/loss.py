"""Loss ops: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both read the (log-)probabilities ``[N, C, d1, ...]`` at each target class with one
``gather`` along the class dim. A target equal to ``ignore_index`` reads class 0 instead
(it may lie outside ``[0, C)``) and gets weight 0, so it adds nothing to the loss and
nothing to the ``mean`` reduction's denominator, which is the sum of the weights used.
"""

from __future__ import annotations

from ember.onnx.context import NodeContext
from ember.onnx.registry import converter

_REDUCTIONS = ("none", "sum", "mean")


def _nll_lines(node: NodeContext, log_prob: str, loss: str) -> list[str]:
    """Lines assigning ``loss``: the negative log-likelihood of ``log_prob`` at the
    node's targets (input 1), weighted by input 2 when present."""
    target, weight = node.input(1), node.input(2)
    reduction = node.attr("reduction", "mean")
    if reduction not in _REDUCTIONS:
        node.unsupported(f"reduction {reduction!r} is not one of none, sum, mean")
    ignore = node.attr("ignore_index", None)
    t, picked, w = node.tmp("target"), node.tmp("picked"), node.tmp("weight")
    lines = [f"{t} = {target.expr}"]
    if ignore is not None:
        mask = node.tmp("ignored")
        lines += [f"{mask} = {t}.equal({int(ignore)})", f"{t} = {t}.mask_fill({mask}, 0)"]
    lines.append(f"{picked} = {log_prob}.gather(1, {t}.unsqueeze_dim(1)).squeeze(1)")
    if weight.present:
        lines.append(f"{w} = {weight.expr}.select(0, {t}.reshape([-1])).reshape({t}.shape)")
    else:
        lines.append(f"{w} = {picked}.ones_like()")
    if ignore is not None:
        lines.append(f"{w} = {w}.mask_fill({mask}, 0.0)")
    terms = node.tmp("terms")
    lines.append(f"{terms} = -{picked} * {w}")
    if reduction == "none":
        lines.append(f"{loss} = {terms}")
    elif reduction == "sum":
        lines.append(f"{loss} = {terms}.sum()")
    else:
        lines.append(f"{loss} = {terms}.sum() / {w}.sum()")
    return lines


@converter("NegativeLogLikelihoodLoss", since=12, attrs=("reduction", "ignore_index"))
def negative_log_likelihood_loss(node: NodeContext) -> list[str]:
    """``-input[n, target[n, d...], d...] * weight[target]``, reduced by ``reduction``
    (default ``mean``: divided by the sum of the weights used)."""
    return _nll_lines(node, node.input(0).expr, node.outputs[0])


@converter("SoftmaxCrossEntropyLoss", since=12, attrs=("reduction", "ignore_index"))
def softmax_cross_entropy_loss(node: NodeContext) -> list[str]:
    """The negative log-likelihood of ``log_softmax(scores)`` along the class dim; the
    optional second output is that ``log_softmax``."""
    scores = node.input(0)
    log_prob = node.outputs[1] if len(node.outputs) > 1 and node.outputs[1] else node.tmp(
        "log_prob")
    lines = [f"{log_prob} = activation.log_softmax({scores.expr}, 1)"]
    return lines + _nll_lines(node, log_prob, node.outputs[0])


__all__ = ["negative_log_likelihood_loss", "softmax_cross_entropy_loss"]
