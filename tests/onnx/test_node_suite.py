"""The ONNX backend node tests (from the onnx wheel), for every op the registry converts.

A case whose graph uses an op without a converter is skipped ("unsupported op X"), as is
one whose inputs or outputs have a type ember has no dtype for. The per-op pass table is
printed at the end of the session (see conftest.py). The light model graphs of the same
wheel (AlexNet, ResNet-50, ... with constant weights) run against onnxruntime.
"""

from __future__ import annotations

import pytest
from onnx_node_cases import case_names, light_names, run_case, run_light

# Cases known to fail, with the reason. Keep this list short and explicit.
EXPECTED_FAILURES: dict[str, str] = {}


def _params() -> list:
    return [
        pytest.param(name, marks=pytest.mark.xfail(reason=EXPECTED_FAILURES[name], strict=True))
        if name in EXPECTED_FAILURES else name
        for name in case_names()
    ]


@pytest.mark.parametrize("case", _params())
def test_node_case(case: str) -> None:
    run_case(case)


@pytest.mark.parametrize("name", light_names())
def test_light_model(name: str) -> None:
    run_light(name)
