"""The committed autodiff coverage table is the one the op table and the rules give now, and
what it states of checkpointing and custom ops holds."""

from __future__ import annotations

import difflib
from pathlib import Path

import numpy as np
import pytest

import ember
from ember import Tensor
from ember.backends.autodiff import Autodiff
from ember.backends.autodiff.coverage import HIGHER, NONE, THROUGH, coverage_rows, coverage_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "autodiff_coverage.md"
REGENERATE = "run `python -m ember.backends.autodiff.coverage > docs/autodiff_coverage.md`"


def test_committed_coverage_table_is_up_to_date():
    committed = DOC.read_text(encoding="utf-8")
    current = coverage_table()
    if committed != current:
        diff = "\n".join(list(difflib.unified_diff(
            committed.splitlines(), current.splitlines(), "committed", "rules", lineterm=""))[:40])  # fmt: skip
        pytest.fail(f"docs/autodiff_coverage.md is out of date: {REGENERATE}\n{diff}")


# The ops without a gradient: Bool / Int outputs, or constants. A new Float op that lands here
# instead of getting a rule fails the test below (were a backward rule to run it, gradients
# through that rule would be first order only).
NO_GRADIENT = {
    "from_data", "into_data", "empty", "full", "random", "is_nan", "is_inf", "equal",
    "equal_elem", "not_equal", "not_equal_elem", "greater", "greater_elem", "greater_equal",
    "greater_equal_elem", "lower", "lower_elem", "lower_equal", "lower_equal_elem", "argmax",
    "argmin", "any", "any_dim", "all", "all_dim",
}


def test_every_float_op_has_a_rule_or_differentiates_through_its_primitives():
    rows = {name: how for name, _, how in coverage_rows()}
    assert {name for name, how in rows.items() if how == NONE} == NO_GRADIENT
    for name in ("matmul", "conv2d", "softmax", "avg_pool2d_backward", "embedding_backward",
                 "interpolate_backward", "max_pool2d_with_indices_backward"):  # fmt: skip
        assert rows[name] == HIGHER, name
    assert rows["conv_transpose_x_backward"] == THROUGH  # a convolution, which has a rule


def test_balanced_checkpointing_gives_the_same_second_derivatives():
    def second(device) -> np.ndarray:
        x = Tensor.from_data(np.linspace(-1.0, 1.0, 6).reshape(2, 3), device).require_grad()
        w = Tensor.from_data(np.arange(6.0).reshape(3, 2) / 5, device)
        y = (x.matmul(w).tanh() * x.sum_dim(1).exp()).sum()
        g = x.grad(y.backward(create_graph=True))
        return x.grad((g * g).sum().backward()).to_numpy()

    plain = second(ember.device("ndarray").autodiff())
    balanced = second(ember.device("ndarray").wrap(lambda b: Autodiff(b, checkpointing="balanced")))
    np.testing.assert_allclose(balanced, plain, rtol=1e-12)


def test_a_custom_op_without_a_rule_has_higher_orders_through_its_reference():
    from test_custom_op import cube  # x^3 by its reference: x * x * x

    x = Tensor.from_data([1.0, -2.0], ember.device("ndarray").autodiff()).require_grad()
    first = x.grad(cube(x).sum().backward(create_graph=True))  # 3 x^2
    assert x.grad(first.sum().backward()).tolist() == [6.0, -12.0]  # 6 x
