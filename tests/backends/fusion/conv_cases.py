"""Random convolution geometries shared by the numba convolution tests."""

from __future__ import annotations

import numpy as np


def random_case(rng: np.random.Generator, max_padding: int = 3) -> tuple:
    """``(input shape, weight shape, stride, padding, dilation, groups)`` drawn so the
    output is at least 1x1."""
    groups = int(rng.choice([1, 1, 1, 2, 3]))
    cg, og = int(rng.integers(1, 5)), int(rng.integers(1, 10))
    kh, kw = (int(k) for k in rng.integers(1, 6, 2))
    stride = tuple(int(s) for s in rng.integers(1, 4, 2))
    dilation = tuple(int(d) for d in rng.integers(1, 3, 2))
    padding = tuple(int(p) for p in rng.integers(0, max_padding + 1, 2))
    h, w = (
        max(1, d * (k - 1) + 1 - 2 * p + int(rng.integers(0, 9)))
        for d, k, p in zip(dilation, (kh, kw), padding)
    )
    n = int(rng.integers(1, 4))
    return (n, cg * groups, h, w), (og * groups, cg, kh, kw), stride, padding, dilation, groups
