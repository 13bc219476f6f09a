"""Backward rules of the activations that run as one fused inner op.

Registering a rule here makes Autodiff forward the composite to the inner
backend (which may have a fast kernel) instead of decomposing it. Each rule
follows PyTorch's autograd where the function has a kink, ties or a branch:

* relu, relu6, hard_sigmoid: gradient 0 at the kinks (``x == 0``, ``x == 6``,
  ``x == +-3``); leaky_relu and prelu take the negative slope at ``x == 0``;
  hard_swish is 0 at ``x == -3`` and 1 at ``x == 3``; elu and celu take the
  exponential branch at ``x == 0``; NaN inputs pick the branch PyTorch picks.
* sigmoid, log_sigmoid, softplus: the smooth derivative everywhere (their
  decompositions through ``min``/``max``/``abs`` gave 1 instead of 1/2 at 0).
* elu, celu: no NaN for large inputs (the decomposition multiplied a zero
  gradient by ``expm1(x) = inf``); quiet_softmax likewise for rows whose
  largest logit is very negative.

Activations whose decomposition already matches PyTorch everywhere stay
decomposed: selu (scaled elu, which has a rule), mish (through softplus),
glu (through sigmoid), softmin (through softmax).
"""

from __future__ import annotations

import math

from ember.backends.autodiff.rule import backward, unbroadcast

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_KAPPA = 0.044715


# ------------------------------------------------------------------ piecewise linear
@backward("relu", keep="output")
def _relu(B, g, s):
    # y <= 0 exactly where x <= 0; NaN passes the gradient through, as in PyTorch.
    return (B.float_mask_fill(g, B.float_lower_equal_elem(s.output, 0.0), 0.0),)


@backward("relu6", keep="output")
def _relu6(B, g, s):
    y = s.output
    outside = B.bool_or(B.float_lower_equal_elem(y, 0.0), B.float_greater_equal_elem(y, 6.0))
    return (B.float_mask_fill(g, outside, 0.0),)


@backward("hard_sigmoid", keep="inputs")
def _hard_sigmoid(B, g, s):
    x = s.inputs[0]
    inside = B.bool_and(B.float_greater_elem(x, -3.0), B.float_lower_elem(x, 3.0))
    return (B.float_mask_fill(B.float_div_scalar(g, 6.0), B.bool_not(inside), 0.0),)


@backward("hard_swish", keep="inputs")
def _hard_swish(B, g, s):
    # 0 for x <= -3, x / 3 + 1/2 for -3 < x < 3, 1 above (and for NaN).
    x = s.inputs[0]
    ramp = B.float_mul(g, B.float_add_scalar(B.float_div_scalar(x, 3.0), 0.5))
    grad = B.float_mask_where(g, B.float_lower_elem(x, 3.0), ramp)
    return (B.float_mask_fill(grad, B.float_lower_equal_elem(x, -3.0), 0.0),)


@backward("leaky_relu", keep="inputs")
def _leaky_relu(B, g, s):
    return (B.leaky_relu_backward(s.inputs[0], g, s.attrs[0]),)


@backward("leaky_relu_backward", keep="inputs")
def _leaky_relu_backward(B, gg, s):
    # Linear in the gradient, piecewise constant in the input (zero derivative): the
    # gradient's gradient is the same op on gg, and the input gets none.
    return None, B.leaky_relu_backward(s.inputs[0], gg, s.attrs[0])


@backward("prelu", keep="inputs")
def _prelu(B, g, s):
    x, alpha = s.inputs
    x_shape, a_shape = s.shapes
    rank = len(x_shape)
    if rank >= 2 and len(a_shape) == 1 and a_shape[0] > 1:  # one slope per channel (dim 1)
        alpha = B.float_reshape(alpha, (1, a_shape[0]) + (1,) * (rank - 2))
    positive = B.float_greater_elem(x, 0.0)
    gx = B.float_mask_where(B.float_mul(g, alpha), positive, g)
    ga = B.float_mask_fill(B.float_mul(g, x), positive, 0.0)
    ga = B.float_reshape(unbroadcast(B, ga, B.shape(alpha)), a_shape)
    return unbroadcast(B, gx, x_shape), ga


# ------------------------------------------------------------------ exponential family
@backward("elu", keep="inputs")
def _elu(B, g, s):
    # alpha * e^x for x <= 0, 1 above (and for NaN); the select drops e^x where it overflows.
    x, alpha = s.inputs[0], s.attrs[0]
    negative = B.float_mul(g, B.float_mul_scalar(B.float_exp(x), alpha))
    return (B.float_mask_where(g, B.float_lower_equal_elem(x, 0.0), negative),)


@backward("celu", keep="inputs")
def _celu(B, g, s):
    x, alpha = s.inputs[0], s.attrs[0]
    negative = B.float_mul(g, B.float_exp(B.float_div_scalar(x, alpha)))
    return (B.float_mask_where(g, B.float_lower_equal_elem(x, 0.0), negative),)


@backward("sigmoid", keep="output")
def _sigmoid(B, g, s):
    y = s.output
    return (B.float_mul(g, B.float_mul(y, B.float_neg(B.float_sub_scalar(y, 1.0)))),)


@backward("log_sigmoid", keep="output")
def _log_sigmoid(B, g, s):
    # d/dx log(sigmoid(x)) = 1 - sigmoid(x) = -expm1(y): exact in both tails.
    return (B.float_neg(B.float_mul(g, B.float_expm1(s.output))),)


@backward("softplus", keep="inputs")
def _softplus(B, g, s):
    x, (beta, threshold) = s.inputs[0], s.attrs
    bx = B.float_mul_scalar(x, beta)
    smooth = B.float_mul(g, B.sigmoid(bx))
    return (B.float_mask_where(smooth, B.float_greater_elem(bx, threshold), g),)


@backward("silu", keep="inputs")
def _silu(B, g, s):
    # sigmoid(x) * (1 + x * (1 - sigmoid(x)))
    x = s.inputs[0]
    sig = B.sigmoid(x)
    one_minus = B.float_neg(B.float_sub_scalar(sig, 1.0))
    return (B.float_mul(g, B.float_mul(sig, B.float_add_scalar(B.float_mul(x, one_minus), 1.0))),)


@backward("gelu", keep="inputs")
def _gelu(B, g, s):
    # Phi(x) + x * phi(x)
    x = s.inputs[0]
    cdf = B.float_mul_scalar(B.float_add_scalar(B.float_erf(B.float_mul_scalar(x, _SQRT_HALF)), 1.0), 0.5)
    pdf = B.float_mul_scalar(B.float_exp(B.float_mul_scalar(B.float_mul(x, x), -0.5)), _INV_SQRT_2PI)
    return (B.float_mul(g, B.float_add(cdf, B.float_mul(x, pdf))),)


@backward("gelu_tanh", keep="inputs")
def _gelu_tanh(B, g, s):
    # y = x/2 (1 + t), t = tanh(k (x + c x^3)); y' = (1 + t)/2 + x/2 (1 - t^2) k (1 + 3 c x^2)
    x = s.inputs[0]
    square = B.float_mul(x, x)
    inner = B.float_mul_scalar(B.float_add(x, B.float_mul_scalar(B.float_mul(square, x), _GELU_KAPPA)), _SQRT_2_OVER_PI)
    t = B.float_tanh(inner)
    left = B.float_mul_scalar(B.float_add_scalar(t, 1.0), 0.5)
    sech2 = B.float_neg(B.float_sub_scalar(B.float_mul(t, t), 1.0))
    slope = B.float_add_scalar(B.float_mul_scalar(square, 3.0 * _GELU_KAPPA * _SQRT_2_OVER_PI), _SQRT_2_OVER_PI)
    right = B.float_mul(B.float_mul_scalar(x, 0.5), B.float_mul(sech2, slope))
    return (B.float_mul(g, B.float_add(left, right)),)


# ------------------------------------------------------------------ normalizers along a dim
def _softmax_like(B, g, s):
    # y (g - sum(g y)): the Jacobian of softmax, and of quiet_softmax (softmax with a zero logit).
    y, dim = s.output, s.attrs[0]
    gy = B.float_mul(g, y)
    return (B.float_sub(gy, B.float_mul(y, B.float_sum_dim(gy, dim))),)


backward("softmax", "quiet_softmax", keep="output")(_softmax_like)


@backward("log_softmax", keep="output")
def _log_softmax(B, g, s):
    y, dim = s.output, s.attrs[0]
    return (B.float_sub(g, B.float_mul(B.float_exp(y), B.float_sum_dim(g, dim))),)
