"""Backward rule of layer norm, which runs as one inner op (PyTorch's on Torch).

With ``n = (x - mean) * rstd`` (``rstd = 1 / sqrt(var + epsilon)``, both over the last
dim) and ``h = g * weight``, the input's gradient is ``rstd * (h - mean(h) - n * mean(h *
n))``; the weight's is ``g * n`` and the bias's ``g``, each summed over the leading dims.
The statistics are computed again from the kept input rather than kept from the forward
pass: on a fusion device they fuse into the gradient's kernel, and the forward kernel
writes only its output; so do the weight's and the bias's sums over the first leading dim
(the kernel's totals, ``fusion.ir.is_total``).
"""

from __future__ import annotations

from ember.backend.base import normalized
from ember.backends.autodiff.rule import backward


@backward("layer_norm", keep="inputs")
def _layer_norm(B, g, s):
    x, weight, bias = s.inputs
    (epsilon,) = s.attrs
    dim = len(s.shapes[0]) - 1
    normed, rstd = normalized(B, x, epsilon)
    gx = gw = gb = None
    if s.needs[0]:
        h = g if weight is None else B.float_mul(g, weight)
        projection = B.float_mul(normed, B.float_mean_dim(B.float_mul(h, normed), dim))
        along = B.float_add(B.float_mean_dim(h, dim), projection)
        gx = B.float_mul(rstd, B.float_sub(h, along))
    summed = {}
    if weight is not None and s.needs[1]:
        summed["weight"] = B.float_mul(g, normed)
    if bias is not None and s.needs[2]:
        summed["bias"] = g
    # Both sums over one leading dim before the next (``unbroadcast``'s sums, side by side):
    # on a fusion device the first two join the gradient's kernel as its totals.
    for lead in range(dim):
        summed = {name: B.float_sum_dim(value, lead) for name, value in summed.items()}
    if "weight" in summed:
        gw = B.float_reshape(summed["weight"], s.shapes[1])
    if "bias" in summed:
        gb = B.float_reshape(summed["bias"], s.shapes[2])
    return gx, gw, gb
