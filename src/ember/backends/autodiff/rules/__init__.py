"""Backward rules, one small function per differentiable op, grouped like the op table."""

from ember.backends.autodiff.rules import (  # noqa: F401
    activation,
    elementwise,
    layout,
    linalg,
    module,
    normalization,
    reduce,
)
