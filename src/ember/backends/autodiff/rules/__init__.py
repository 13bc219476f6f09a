"""Backward rules, one small function per differentiable op, grouped like the op table."""

from ember.backends.autodiff.rules import elementwise, reduce  # noqa: F401
