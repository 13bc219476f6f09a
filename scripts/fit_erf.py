"""Fit the coefficients of the float32 erf approximations in ``numba_math``.

Run: ``.venv/bin/python scripts/fit_erf.py`` (two to three minutes); it prints each set as the
Python tuple that ``numba_math`` holds. Each set approximates ``erf(x * k)`` for one
factor ``k`` (1; ``1 / float32(sqrt 2)``, a GELU's ``x / sqrt 2``; ``float32(1 / sqrt 2)``,
its ``x * (1 / sqrt 2)``) in two pieces of ``b = |x|``:

* below ``split``: ``b (c0 + z P(z))`` with ``z = b**2``, ``P`` of degree 4 and the leading
  coefficient ``c0 = 2 k / sqrt(pi)`` in two float32 parts;
* from ``split`` to ``clamp``: ``1 - Q(b - centre)**4`` with ``Q`` of degree 8, a fit of
  ``erfc(b k) ** (1 / 4)``. The fourth root falls far more slowly than erfc itself, so a
  polynomial of degree 8 fits it where erfc alone needed a rational function (and its
  division, the slowest instruction of the loop).

Each fit minimizes the largest weighted error (Lawson's iteratively reweighted least
squares) against ``math.erf`` / ``math.erfc`` in float64; the coefficients are then rounded
to float32 one at a time, the others refitted, and finally nudged by a few float32 steps
each while that lowers the largest error of the float32 evaluation (emulated with NumPy
over dense sets of float32 inputs). ``tests/backends/fusion/test_numba_runtime.py`` checks
the kernels themselves.
"""

from __future__ import annotations

import math

import numpy as np

F32 = np.float32
DEGREE_SMALL = 4
DEGREE_LARGE = 8


def lawson(basis: np.ndarray, target: np.ndarray, weight: np.ndarray, rounds: int = 300):
    """Coefficients minimizing ``max |weight (basis @ c - target)|``."""
    u = np.full(len(target), 1.0 / len(target))
    for _ in range(rounds):
        w = np.sqrt(u) * weight
        c, *_ = np.linalg.lstsq(basis * w[:, None], target * w, rcond=None)
        err = np.abs(weight * (basis @ c - target))
        u = u * err
        u /= u.sum()
    return c


def rounded_in_turn(basis, target, weight) -> np.ndarray:
    """A fit whose coefficients are rounded to float32 one at a time, the rest refitted."""
    c = lawson(basis, target, weight)
    fixed: list[float] = []
    for i in range(basis.shape[1]):
        fixed.append(float(F32(c[i])))
        if i + 1 < basis.shape[1]:
            rest = lawson(
                basis[:, i + 1 :], target - basis[:, : i + 1] @ np.array(fixed), weight, 150
            )
            c = np.concatenate([fixed, rest])
    return np.array(fixed, dtype=F32)


def floats(lo: float, hi: float, step: int) -> np.ndarray:
    first, last = (int(F32(v).view(np.int32)) for v in (lo, hi))
    return np.arange(first, last + 1, step, dtype=np.int32).view(F32)


def erf64(x: np.ndarray, k: float) -> np.ndarray:
    return np.frompyfunc(lambda v: math.erf(float(v) * k), 1, 1)(x).astype(np.float64)


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    _, e = np.frexp(np.abs(want))
    return np.abs(got.astype(np.float64) - want) / np.ldexp(1.0, np.maximum(e - 24, -149))


def _fma(a, b, c):
    return (np.asarray(a, np.float64) * b + c).astype(F32).astype(np.float64)


def small_piece(b, c0_hi, c0_lo, p):
    z = (b * b).astype(F32).astype(np.float64)
    acc = np.full(b.shape, float(p[-1]))
    for c in p[-2::-1]:
        acc = _fma(acc, z, float(c))
    inner = (b * _fma(acc, z, float(c0_lo))).astype(F32).astype(np.float64)
    return _fma(b, float(c0_hi), inner)


def large_piece(b, centre, q):
    t = (b - centre).astype(F32).astype(np.float64)
    acc = np.full(b.shape, float(q[-1]))
    for c in q[-2::-1]:
        acc = _fma(acc, t, float(c))
    q2 = (acc * acc).astype(F32).astype(np.float64)
    return _fma(-q2, q2, 1.0)


def nudge(coefficients: np.ndarray, error) -> np.ndarray:
    """Move single coefficients by a few float32 steps while the largest error falls."""
    best = error(coefficients)
    better = True
    while better:
        better = False
        for i in range(len(coefficients)):
            for step in (1, -1, 2, -2, 3, -3, 5, -5, 8, -8):
                trial = coefficients.copy()
                trial[i : i + 1] = (trial[i : i + 1].view(np.int32) + step).view(F32)
                e = error(trial)
                if e < best - 1e-4:
                    best, coefficients, better = e, trial, True
    return coefficients


def fit_small(k: float, split: float):
    c0 = 2.0 * k / math.sqrt(math.pi)
    c0_hi = F32(c0)
    c0_lo = F32(c0 - float(c0_hi))
    b = np.linspace(split / 4000, float(split) * 1.01, 20001)
    f = erf64(b, k)
    z = b * b
    target = (f / b - c0) / z
    weight = b * z / f  # relative error of erf
    basis = np.vander(z, DEGREE_SMALL + 1, increasing=True)
    p = rounded_in_turn(basis, target, weight)
    x = np.concatenate([floats(split / 64, split * 1.01, 13), floats(split * 0.8, split * 1.01, 1)])
    want = erf64(x, k)
    xx = x.astype(np.float64)
    p = nudge(p, lambda c: ulps(small_piece(xx, c0_hi, c0_lo, c), want).max())
    return c0_hi, c0_lo, p, ulps(small_piece(xx, c0_hi, c0_lo, p), want).max()


def fit_large(k: float, split: float, centre: float, clamp: float):
    b = np.linspace(split * 0.99, clamp, 30001)
    g = np.frompyfunc(lambda v: math.erfc(float(v) * k), 1, 1)(b).astype(np.float64) ** 0.25
    t = b - centre
    basis = np.vander(t, DEGREE_LARGE + 1, increasing=True)
    q = rounded_in_turn(basis, g, 4 * g**3)  # d(g**4)/dg: the absolute error of erfc
    x = np.concatenate([floats(split * 0.99, split * 1.7, 3), floats(split * 1.7, clamp, 97)])
    want = erf64(x, k)
    xx = x.astype(np.float64)
    q = nudge(q, lambda c: ulps(large_piece(xx, centre, c), want).max())
    return q, ulps(large_piece(xx, centre, q), want).max()


SETS = {
    # name: (k, split, centre, clamp); split, centre and clamp are float32 values, the
    # centre a multiple of 2**-4 so that b - centre is exact in float32 (see numba_math)
    "erf": (1.0, 0.9375, 0.75, 3.925),
    "erf_div_sqrt2": (1.0 / float(F32(math.sqrt(2.0))), 1.328125, 1.0625, 5.5625),
    "erf_mul_rsqrt2": (float(F32(1.0 / math.sqrt(2.0))), 1.328125, 1.0625, 5.5625),
}


def main() -> None:
    for name, (k, split, centre, clamp) in SETS.items():
        c0_hi, c0_lo, p, small_err = fit_small(k, split)
        q, large_err = fit_large(k, split, centre, clamp)
        print(
            f"# {name}: erf(x * {k!r}); emulated float32 error: {small_err:.3f} ulp below "
            f"{split}, {large_err:.3f} from there"
        )
        values = [repr(float(F32(v))) for v in (c0_hi, c0_lo, *p, split, centre, *q, clamp)]
        rows = [values[0:2], values[2:5], values[5:7], values[7:9], values[9:13],
                values[13:17], values[17:19]]  # fmt: skip
        print(f"_{name.upper()} = _erf_set(  # c0 | P | split, centre | Q | clamp")
        print(",\n".join("    " + ", ".join(row) for row in rows) + ")  # fmt: skip")


if __name__ == "__main__":
    main()
