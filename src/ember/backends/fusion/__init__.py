"""Fusion: a backend decorator that records ops lazily, fuses them and runs compiled kernels.

Plan and state: ``docs/fusion_plan.md``.
"""
