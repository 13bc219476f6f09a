"""Losses: values and gradients against torch.nn.functional, every reduction, the options
(class weights, label smoothing, padding, log targets, margins), extreme inputs, and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from nn_helpers import assert_close, from_torch

from ember import Tensor
from ember.backend.errors import ArgumentError, ConfigError, EmberIndexError, KindError, ShapeError
from ember.nn.loss import (
    BinaryCrossEntropyLoss,
    BinaryCrossEntropyLossConfig,
    CosineEmbeddingLossConfig,
    CrossEntropyLoss,
    CrossEntropyLossConfig,
    HuberLossConfig,
    KLDivLossConfig,
    MseLoss,
    MseLossConfig,
    SmoothL1LossConfig,
)

REDUCTIONS = ("mean", "sum", "none")


def compare(device, loss, reference, inputs, grad=(0,), atol=1e-5):
    """Runs ``loss`` on ember and ``reference`` on torch with the same inputs; checks the
    values and the gradients of the inputs at the positions ``grad``.

    An unreduced loss is weighted by a random upstream gradient before it is summed, so each
    element's gradient is checked on its own.
    """
    ref_inputs = [t.detach().clone().requires_grad_(i in grad) for i, t in enumerate(inputs)]
    expected = reference(*ref_inputs)
    ours = [from_torch(t, device) for t in inputs]
    ours = [x.require_grad() if i in grad else x for i, x in enumerate(ours)]
    out = loss(*ours)
    assert out.shape == tuple(expected.shape)
    assert_close(out, expected, atol=atol)

    upstream = torch.rand(expected.shape, dtype=expected.dtype) + 0.5
    (expected * upstream).sum().backward()
    grads = (out * from_torch(upstream, device)).sum().backward()
    for i in grad:
        assert_close(ours[i].grad(grads), ref_inputs[i].grad, atol=atol)
    return out, grads, ours


def finite(t: Tensor) -> bool:
    return bool(np.isfinite(t.to_numpy()).all())


# ------------------------------------------------------------------ cross entropy
CE_CASES = {
    "plain": {},
    "weights": {"weights": [0.5, 2.0, 1.0, 3.0]},
    "smoothing": {"smoothing": 0.2},
    "weights+smoothing": {"weights": [0.5, 2.0, 1.0, 3.0], "smoothing": 0.3},
    "pad": {"pad_tokens": [2]},
    "pad+weights+smoothing": {"pad_tokens": [2], "weights": [0.5, 2.0, 1.0, 3.0], "smoothing": 0.1},
}


@pytest.mark.parametrize("options", list(CE_CASES.values()), ids=list(CE_CASES))
def test_cross_entropy_matches_torch(ad_device, options):
    torch.manual_seed(0)
    logits = torch.randn(6, 4) * 3
    targets = torch.tensor([0, 2, 1, 3, 2, 1])
    weights = torch.tensor(options["weights"]) if "weights" in options else None
    pad = options.get("pad_tokens", [-100])[0]
    for reduction in REDUCTIONS:
        loss = CrossEntropyLossConfig(**options, reduction=reduction).init(ad_device)

        def reference(x, t, reduction=reduction):
            return F.cross_entropy(
                x,
                t,
                weight=weights,
                ignore_index=pad,
                reduction=reduction,
                label_smoothing=options.get("smoothing", 0.0),
            )

        compare(ad_device, loss, reference, [logits, targets])


def test_cross_entropy_ignores_every_pad_token(ad_device):
    # Two pad tokens, one of them not even a class: torch takes one ignore_index, so both
    # are rewritten to it for the reference.
    torch.manual_seed(1)
    logits = torch.randn(5, 3)
    targets = torch.tensor([0, 7, 2, 0, 1])
    ignored = (targets == 0) | (targets == 7)
    weights = torch.tensor([1.0, 2.0, 0.5])
    for reduction in REDUCTIONS:
        loss = CrossEntropyLossConfig(
            pad_tokens=[0, 7], weights=weights.tolist(), reduction=reduction
        ).init(ad_device)

        def reference(x, t, reduction=reduction):
            return F.cross_entropy(
                x, t.masked_fill(ignored, -100), weight=weights, reduction=reduction
            )

        _, grads, (x, _) = compare(ad_device, loss, reference, [logits, targets])
        assert x.grad(grads).to_numpy()[ignored.numpy()].tolist() == [[0.0] * 3] * 3


@pytest.mark.parametrize("weights", [None, [1.0, 2.0, 3.0]], ids=["unweighted", "weighted"])
def test_cross_entropy_of_an_all_padding_batch_is_zero(ad_device, weights):
    # PyTorch divides 0 by 0 here and returns NaN; ember returns 0 and zero gradients.
    targets = Tensor.from_data([1, 1, 1], ad_device)
    for reduction, shape in [("mean", ()), ("sum", ()), ("none", (3,))]:
        loss = CrossEntropyLossConfig(
            pad_tokens=[1], weights=weights, smoothing=0.1, reduction=reduction
        ).init(ad_device)
        x = Tensor.random([3, 3], device=ad_device).require_grad()
        out = loss(x, targets)
        assert out.shape == shape
        assert np.all(out.to_numpy() == 0.0)
        assert np.all(x.grad(out.sum().backward()).to_numpy() == 0.0)
    expected = F.cross_entropy(torch.randn(3, 3), torch.tensor([1, 1, 1]), ignore_index=1)
    assert math.isnan(expected.item())  # the difference from PyTorch this test documents


def test_cross_entropy_on_probabilities_matches_nll_of_their_log(ad_device):
    torch.manual_seed(2)
    probs = torch.softmax(torch.randn(5, 4), dim=1)
    targets = torch.tensor([3, 0, 1, 1, 2])
    weights = torch.tensor([1.0, 0.5, 2.0, 1.5])
    for reduction in REDUCTIONS:
        loss = CrossEntropyLossConfig(
            logits=False, pad_tokens=[2], weights=weights.tolist(), reduction=reduction
        ).init(ad_device)

        def reference(p, t, reduction=reduction):
            return F.nll_loss(p.log(), t, weight=weights, ignore_index=2, reduction=reduction)

        compare(ad_device, loss, reference, [probs, targets])

    # smoothed: -sum_c q_c log p_c with q = (1 - s) one_hot + s / classes, by hand
    loss = CrossEntropyLossConfig(logits=False, smoothing=0.4).init(ad_device)

    def smoothed(p, t):
        q = F.one_hot(t, 4).float() * 0.6 + 0.1
        return -(q * p.log()).sum(1).mean()

    compare(ad_device, loss, smoothed, [probs, targets])


def test_cross_entropy_on_probabilities_with_zeros_has_finite_gradients(ad_device):
    # Zero probabilities off the targets and in a padded row: torch's nll_loss(p.log()) gives
    # NaN gradients there (0 / 0 in the log's backward); ember takes the log of the targets'
    # probabilities only, which the reference below does too.
    probs = torch.tensor([[0.0, 0.3, 0.7], [0.5, 0.5, 0.0], [0.0, 1.0, 0.0]])
    targets = torch.tensor([1, 0, 2])
    loss = CrossEntropyLossConfig(logits=False, pad_tokens=[2]).init(ad_device)

    def reference(p, t):
        return -p[[0, 1], t[:2]].log().mean()

    _, grads, (p, _) = compare(ad_device, loss, reference, [probs, targets])
    assert finite(p.grad(grads))
    nll = F.nll_loss(probs.log(), targets, ignore_index=2)  # the same value
    assert_close(loss(from_torch(probs, ad_device), from_torch(targets, ad_device)), nll)


def test_cross_entropy_is_finite_for_extreme_logits(ad_device):
    logits = torch.tensor([[1e4, -1e4, 0.0], [-3e4, 3e4, 1e4], [80.0, 80.0, -80.0]])
    targets = torch.tensor([1, 0, 2])
    weights = torch.tensor([1.0, 2.0, 3.0])
    loss = CrossEntropyLossConfig(weights=weights.tolist(), smoothing=0.1).init(ad_device)

    def reference(x, t):
        return F.cross_entropy(x, t, weight=weights, label_smoothing=0.1)

    out, grads, (x, _) = compare(ad_device, loss, reference, [logits, targets], atol=1e-3)
    assert finite(out) and finite(x.grad(grads))


def test_cross_entropy_weights_follow_the_logits_device_and_dtype(ad_device):
    loss = CrossEntropyLossConfig(weights=[1.0, 3.0]).init()  # weights on the default device
    logits = torch.tensor([[0.3, -0.2], [1.0, 2.0]], dtype=torch.float64)
    targets = torch.tensor([1, 0])
    out = loss(from_torch(logits, ad_device), from_torch(targets, ad_device))
    assert out.dtype.name == "F64"
    expected = F.cross_entropy(
        logits, targets, weight=torch.tensor([1.0, 3.0], dtype=torch.float64)
    )
    assert_close(out, expected, atol=1e-12)


def test_cross_entropy_config_round_trips_through_json():
    config = CrossEntropyLossConfig(
        pad_tokens=[0], weights=[1.0, 2.0], smoothing=0.1, reduction="sum"
    )
    assert CrossEntropyLossConfig.load_json(config.to_json()) == config
    assert config.with_logits(False).logits is False
    default = CrossEntropyLossConfig()
    assert (default.pad_tokens, default.weights, default.smoothing) == (None, None, None)
    assert (default.logits, default.reduction) == (True, "mean")


@pytest.mark.parametrize(
    ("logits", "targets", "options", "error", "message"),
    [([4], [4], {}, ShapeError, r"CrossEntropyLoss: expected logits of shape \[batch, classes\], got \[4\]"),
     ([4, 3], [5], {}, ShapeError, r"expected targets of shape \[4\] \(the batch of the logits \[4, 3\]\), got \[5\]"),
     ([4, 3], [4, 1], {}, ShapeError, r"got \[4, 1\]"),
     ([4, 3], [4], {"weights": [1.0, 2.0]}, ShapeError,
      r"CrossEntropyLoss: got 2 class weights for logits with 3 classes \[4, 3\]")],
)  # fmt: skip
def test_cross_entropy_shape_errors(base_device, logits, targets, options, error, message):
    loss = CrossEntropyLossConfig(**options).init(base_device)
    with pytest.raises(error, match=message):
        loss(Tensor.zeros(logits, base_device), Tensor.zeros(targets, base_device).int())


@pytest.mark.parametrize("bad", [3, -1])
def test_cross_entropy_targets_out_of_range_are_index_errors(base_device, bad):
    loss = CrossEntropyLossConfig(smoothing=0.1).init(base_device)  # one-hot: no gather to fail
    logits = Tensor.zeros([2, 3], base_device)
    with pytest.raises(EmberIndexError, match=rf"CrossEntropyLoss: targets \(class indices\) "
                                              rf"must be in \[0, 3\), got {min(bad, 1)} to {max(bad, 1)}"):  # fmt: skip
        loss(logits, Tensor.from_data([1, bad], base_device))


def test_cross_entropy_kind_errors(base_device):
    loss = CrossEntropyLossConfig().init(base_device)
    logits = Tensor.zeros([2, 3], base_device)
    with pytest.raises(
        KindError, match=r"CrossEntropyLoss: targets \(class indices\) must be Int, got Float"
    ):
        loss(logits, Tensor.zeros([2], base_device))
    with pytest.raises(KindError, match=r"CrossEntropyLoss: logits must be Float, got Int"):
        loss(logits.int(), Tensor.zeros([2], base_device).int())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"smoothing": 1.5}, r"CrossEntropyLossConfig.smoothing: expected less than or equal to 1"),
     ({"smoothing": -0.1}, r"CrossEntropyLossConfig.smoothing: expected greater than or equal to 0"),
     ({"weights": [1.0, -2.0]}, r"CrossEntropyLossConfig.weights\[1\]: expected greater than or equal to 0"),
     ({"weights": []}, r"CrossEntropyLossConfig.weights: .*at least 1"),
     ({"pad_tokens": [0.5]}, r"CrossEntropyLossConfig.pad_tokens\[0\]: expected an integer"),
     ({"reduction": "avg"}, r"CrossEntropyLossConfig.reduction: expected 'mean', 'sum' or 'none', got 'avg'")],
)  # fmt: skip
def test_cross_entropy_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        CrossEntropyLossConfig(**kwargs)


def test_a_loss_built_with_an_invalid_reduction_raises_on_forward(base_device):
    x = Tensor.zeros([2, 3], base_device)
    with pytest.raises(
        ArgumentError,
        match=r"CrossEntropyLoss: reduction must be 'mean', 'sum' or 'none', got 'avg'",
    ):
        CrossEntropyLoss(reduction="avg")(x, Tensor.zeros([2], base_device).int())
    with pytest.raises(ArgumentError, match=r"MseLoss: reduction must be"):
        MseLoss(reduction="max")(x, x)


# ------------------------------------------------------------------ binary cross entropy
def test_binary_cross_entropy_with_logits_matches_torch(ad_device):
    torch.manual_seed(3)
    logits = torch.randn(4, 3) * 4
    targets = torch.tensor([[1, 0, 1], [0, 0, 1], [1, 1, 0], [0, 1, 0]])
    weights = torch.tensor([0.5, 2.0, 1.5])
    for reduction in REDUCTIONS:
        for smoothing in (None, 0.2):
            loss = BinaryCrossEntropyLossConfig(
                logits=True, weights=weights.tolist(), smoothing=smoothing, reduction=reduction
            )
            s = smoothing or 0.0

            def reference(x, t, reduction=reduction, s=s):
                return F.binary_cross_entropy_with_logits(
                    x, t.float() * (1 - s) + s / 2, weight=weights, reduction=reduction
                )

            compare(ad_device, loss.init(ad_device), reference, [logits, targets])


def test_binary_cross_entropy_on_probabilities_matches_torch(ad_device):
    torch.manual_seed(4)
    probs = torch.rand(6) * 0.98 + 0.01
    targets = torch.tensor([1, 0, 0, 1, 1, 0])
    class_weights = torch.tensor([3.0, 0.5])  # [batch] targets: a weight per class
    for reduction in REDUCTIONS:
        loss = BinaryCrossEntropyLossConfig(weights=class_weights.tolist(), reduction=reduction)

        def reference(p, t, reduction=reduction):
            return F.binary_cross_entropy(
                p, t.float(), weight=class_weights[t], reduction=reduction
            )

        compare(ad_device, loss.init(ad_device), reference, [probs, targets])


def test_binary_cross_entropy_takes_soft_float_targets(ad_device):
    torch.manual_seed(5)
    logits, targets = torch.randn(2, 5), torch.rand(2, 5)
    for use_logits, reference in [
        (True, F.binary_cross_entropy_with_logits),
        (False, F.binary_cross_entropy),
    ]:
        x = logits if use_logits else torch.sigmoid(logits)
        loss = BinaryCrossEntropyLossConfig(logits=use_logits).init(ad_device)
        compare(ad_device, loss, reference, [x, targets], grad=(0, 1))


def test_binary_cross_entropy_is_finite_for_extreme_inputs(ad_device):
    logits = torch.tensor([1e4, -1e4, 200.0, -200.0, 0.0])
    targets = torch.tensor([0, 1, 1, 0, 1])
    loss = BinaryCrossEntropyLossConfig(logits=True, reduction="none").init(ad_device)

    def reference(x, t):
        return F.binary_cross_entropy_with_logits(x, t, reduction="none")

    out, grads, (x, _) = compare(ad_device, loss, reference, [logits, targets.float()], atol=1e-3)
    assert finite(out) and finite(x.grad(grads))

    # Saturated probabilities: each log is clamped at -100 as in torch; the clamped terms
    # have no gradient (torch gives (p - t) / 1e-12 there), the others match torch.
    probs = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.3])
    targets = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
    expected = F.binary_cross_entropy(probs, targets, reduction="none")
    p = from_torch(probs, ad_device).require_grad()
    out = BinaryCrossEntropyLossConfig(reduction="none").init(ad_device)(
        p, from_torch(targets, ad_device)
    )
    assert_close(out, expected)
    assert out.tolist()[:2] == [100.0, 100.0]
    gradient = p.grad(out.sum().backward()).to_numpy()
    assert np.isfinite(gradient).all()
    np.testing.assert_allclose(gradient, [0.0, 0.0, 1.0, -1.0, -1 / 0.3], rtol=1e-5)


def test_binary_cross_entropy_errors(base_device):
    x = Tensor.zeros([4], base_device)
    labels = Tensor.zeros([2, 3], base_device)
    with pytest.raises(
        ShapeError,
        match=r"BinaryCrossEntropyLoss: targets must have the shape of the logits \[4\], got \[3\]",
    ):
        BinaryCrossEntropyLossConfig().init(base_device)(x, Tensor.zeros([3], base_device))
    with pytest.raises(
        ShapeError, match=r"expected logits of shape \[batch\] or \[\.\.\., labels\], got \[\]"
    ):
        BinaryCrossEntropyLossConfig().init(base_device)(x.sum(), x.sum())
    with pytest.raises(
        KindError, match=r"BinaryCrossEntropyLoss: targets must be Int or Float, got Bool"
    ):
        BinaryCrossEntropyLossConfig().init(base_device)(x, x.bool())
    weighted = BinaryCrossEntropyLossConfig(weights=[1.0, 2.0]).init(base_device)
    with pytest.raises(
        KindError,
        match=r"\[batch\] targets are picked by the target class, so the targets must be Int, got Float",
    ):
        weighted(x, x)
    with pytest.raises(
        ShapeError, match=r"got 2 class weights for logits \[2, 3\] with 3 labels \(the last dim\)"
    ):
        weighted(labels, labels)
    with pytest.raises(
        ShapeError, match=r"\[batch\] targets take 2 class weights \(class 0 and class 1\), got 3"
    ):
        BinaryCrossEntropyLossConfig(weights=[1.0, 2.0, 3.0]).init(base_device)(x, x.int())
    with pytest.raises(
        ConfigError,
        match=r"BinaryCrossEntropyLossConfig.smoothing: expected less than or equal to 1",
    ):
        BinaryCrossEntropyLossConfig(smoothing=2.0)
    assert BinaryCrossEntropyLossConfig().logits is False  # Burn's default: probabilities
    assert isinstance(weighted, BinaryCrossEntropyLoss)


# ------------------------------------------------------------------ regression losses
REGRESSION = {
    "mse": (lambda r: MseLossConfig(reduction=r), lambda r: (lambda x, y: F.mse_loss(x, y, reduction=r))),
    "huber": (lambda r: HuberLossConfig(0.7, reduction=r),
              lambda r: (lambda x, y: F.huber_loss(x, y, reduction=r, delta=0.7))),
    "smooth_l1": (lambda r: SmoothL1LossConfig(beta=0.5, reduction=r),
                  lambda r: (lambda x, y: F.smooth_l1_loss(x, y, reduction=r, beta=0.5))),
    "l1": (lambda r: SmoothL1LossConfig(beta=0.0, reduction=r),
           lambda r: (lambda x, y: F.smooth_l1_loss(x, y, reduction=r, beta=0.0))),
}  # fmt: skip


@pytest.mark.parametrize("name", list(REGRESSION))
def test_regression_losses_match_torch(ad_device, name):
    torch.manual_seed(6)
    predictions = torch.randn(3, 4) * 2
    targets = torch.randn(3, 4)
    # exact ties at the kinks: no error, and errors of exactly +-0.5 and +-0.7
    targets[0, :3] = predictions[0, :3] - torch.tensor([0.0, 0.5, -0.7])
    config, reference = REGRESSION[name]
    for reduction in REDUCTIONS:
        loss = config(reduction).init(ad_device)
        compare(ad_device, loss, reference(reduction), [predictions, targets], grad=(0, 1))


def test_regression_loss_errors(base_device):
    x = Tensor.zeros([2, 3], base_device)
    with pytest.raises(
        ShapeError,
        match=r"MseLoss: targets must have the shape of the predictions \[2, 3\], got \[3\]",
    ):
        MseLossConfig().init(base_device)(x, Tensor.zeros([3], base_device))
    with pytest.raises(KindError, match=r"HuberLoss: targets must be Float, got Int"):
        HuberLossConfig(1.0).init(base_device)(x, x.int())
    with pytest.raises(KindError, match=r"SmoothL1Loss: predictions must be Float, got Int"):
        SmoothL1LossConfig().init(base_device)(x.int(), x)
    with pytest.raises(ConfigError, match=r"HuberLossConfig.delta: expected greater than 0"):
        HuberLossConfig(0.0)
    with pytest.raises(ConfigError, match=r"HuberLossConfig.delta"):
        HuberLossConfig()  # Burn's HuberLossConfig has no default delta
    with pytest.raises(
        ConfigError, match=r"SmoothL1LossConfig.beta: expected greater than or equal to 0"
    ):
        SmoothL1LossConfig(beta=-1.0)
    with pytest.raises(
        ConfigError, match=r"MseLossConfig.reduction: expected 'mean', 'sum' or 'none'"
    ):
        MseLossConfig(reduction="batchmean")


# ------------------------------------------------------------------ KL divergence
@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides:UserWarning")
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div_matches_torch(ad_device, log_target):
    torch.manual_seed(7)
    log_probs = torch.log_softmax(torch.randn(3, 5), dim=1)
    targets = torch.softmax(torch.randn(3, 5) * 2, dim=1)
    if log_target:
        targets = targets.log()
    else:
        targets[0, 1] = 0.0  # 0 log 0 counts 0
    for reduction in ("batchmean", "mean", "sum", "none"):
        loss = KLDivLossConfig(log_target=log_target, reduction=reduction).init(ad_device)

        def reference(x, t, reduction=reduction):
            return F.kl_div(x, t, reduction=reduction, log_target=log_target)

        # target gradients only for log targets: torch's is NaN at a zero probability
        compare(
            ad_device, loss, reference, [log_probs, targets], grad=(0, 1) if log_target else (0,)
        )


def test_kl_div_defaults_to_batchmean_and_checks_inputs(base_device):
    assert KLDivLossConfig().reduction == "batchmean"  # PyTorch's default is "mean"
    x = Tensor.zeros([2, 3], base_device)
    with pytest.raises(
        ShapeError,
        match=r"KLDivLoss: targets must have the shape of the log-probabilities \[2, 3\], got \[3, 2\]",
    ):
        KLDivLossConfig().init(base_device)(x, Tensor.zeros([3, 2], base_device))
    with pytest.raises(KindError, match=r"KLDivLoss: targets must be Float, got Int"):
        KLDivLossConfig().init(base_device)(x, x.int())
    with pytest.raises(
        ConfigError,
        match=r"KLDivLossConfig.reduction: expected 'mean', 'batchmean', 'sum' or 'none'",
    ):
        KLDivLossConfig(reduction="avg")


# ------------------------------------------------------------------ cosine embedding
def test_cosine_embedding_matches_torch(ad_device):
    torch.manual_seed(8)
    x1, x2 = torch.randn(5, 4), torch.randn(5, 4)
    x2[3] = 0.0  # a zero vector: cosine 0, finite gradients
    x1[4] = x2[4] * 2.0  # a dissimilar pair that is parallel: cosine 1
    for targets in (torch.tensor([1, -1, -1, 1, -1]), torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0])):
        for reduction in REDUCTIONS:
            loss = CosineEmbeddingLossConfig(margin=-0.2, reduction=reduction).init(ad_device)

            def reference(a, b, t, reduction=reduction):
                return F.cosine_embedding_loss(a, b, t, margin=-0.2, reduction=reduction)

            compare(ad_device, loss, reference, [x1, x2, targets], grad=(0, 1), atol=1e-4)


def test_cosine_embedding_of_one_pair(ad_device):
    a, b = torch.tensor([1.0, 2.0, -1.0]), torch.tensor([0.5, -1.0, 2.0])
    loss = CosineEmbeddingLossConfig(margin=0.1, reduction="none").init(ad_device)
    for target in (1, -1):

        def reference(x, y, t):
            return F.cosine_embedding_loss(x, y, t, margin=0.1, reduction="none")

        compare(ad_device, loss, reference, [a, b, torch.tensor(target)], grad=(0, 1))


def test_cosine_embedding_errors(base_device):
    loss = CosineEmbeddingLossConfig().init(base_device)
    x = Tensor.zeros([3, 4], base_device)
    targets = Tensor.ones([3], base_device)
    with pytest.raises(
        ShapeError,
        match=r"CosineEmbeddingLoss: x2 must have the shape of the x1 \[3, 4\], got \[3, 5\]",
    ):
        loss(x, Tensor.zeros([3, 5], base_device), targets)
    with pytest.raises(
        ShapeError,
        match=r"expected targets of shape \[3\] \(one per pair of the inputs \[3, 4\]\), got \[4\]",
    ):
        loss(x, x, Tensor.ones([4], base_device))
    with pytest.raises(
        ShapeError,
        match=r"expected inputs of shape \[batch, features\] or \[features\], got \[2, 3, 4\]",
    ):
        loss(Tensor.zeros([2, 3, 4], base_device), Tensor.zeros([2, 3, 4], base_device), targets)
    with pytest.raises(
        KindError, match=r"CosineEmbeddingLoss: targets must be Int or Float, got Bool"
    ):
        loss(x, x, targets.bool())
    with pytest.raises(
        ConfigError, match=r"CosineEmbeddingLossConfig.margin: expected less than or equal to 1"
    ):
        CosineEmbeddingLossConfig(margin=1.5)
