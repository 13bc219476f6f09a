"""The conformance suite's fixtures: every test here runs once per backend under test.

``EMBER_TEST_BACKENDS`` (comma separated) picks the backends; by default every
backend whose dependencies are installed runs. A backend or decorator joins the
suite by adding one entry to ``BACKENDS``: the tests themselves never change.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

import ember
from ember.backends.trace import Trace

BACKENDS: dict[str, Callable[[], ember.Device]] = {
    "ndarray": lambda: ember.device("ndarray"),
    # The smallest decorator: every op goes through the generic decorator path.
    "trace": lambda: ember.device("ndarray").wrap(lambda inner: Trace(inner, on_op=lambda record: None)),
    "torch": lambda: ember.device("torch"),
    "autodiff": lambda: ember.device("ndarray").autodiff(),
    "autodiff-torch": lambda: ember.device("torch").autodiff(),
    # Lazy streams and fused kernels over NdArray, and gradients through them.
    "fusion": lambda: ember.device("ndarray").fusion(runtime="interpreter"),
    "autodiff-fusion": lambda: ember.device("ndarray").fusion(runtime="interpreter").autodiff(),
    "fusion-torch": lambda: ember.device("torch").fusion(runtime="interpreter"),
    # The same through compiled kernels (ember[jit]): run when named (see OPT_IN).
    "fusion-numba": lambda: _numba_fusion(),
    "torch-cuda": lambda: _cuda_device(),
    # Triton kernels generated from the fused IR: on CPU tensors through Triton's
    # interpreter here, and on the GPU where there is one (ember[gpu-jit]).
    "fusion-triton": lambda: _triton_fusion(),
    "fusion-torch-cuda": lambda: _cuda_fusion(),
    "autodiff-fusion-torch-cuda": lambda: _cuda_fusion().autodiff(),
}


def _numba_fusion() -> ember.Device:
    from ember.backends.fusion import numba_runtime

    if not numba_runtime.available():
        pytest.skip("numba is not installed: the fusion-numba cases need ember[jit]")
    return ember.device("ndarray").fusion(runtime="numba")


def _triton_fusion() -> ember.Device:
    """``fusion(torch)`` on the Triton runtime in Triton's interpreter (CPU tensors)."""
    from ember.backends.fusion import triton_runtime

    if not triton_runtime.available():
        pytest.skip("triton is not installed: the fusion-triton cases need ember[gpu-jit]")
    with triton_runtime.interpreter():
        return ember.device("torch").fusion(runtime="triton")


def _cuda_fusion() -> ember.Device:
    device = _cuda_device()
    from ember.backends.fusion import triton_runtime

    if not triton_runtime.available():
        pytest.skip("triton is not installed: the fusion-torch-cuda cases need ember[gpu-jit]")
    return device.fusion(runtime="triton")


def _cuda_device() -> ember.Device:
    if ember.device_count("torch", "cuda") == 0:
        pytest.skip("no CUDA device: the suite's torch-cuda cases run only where torch sees a GPU")
    import torch

    # cuDNN computes f32 convolutions in TF32 by default (10-bit mantissa); the suite checks
    # the backend's f32 results against f32 references, so it asks for full f32.
    torch.backends.cudnn.allow_tf32 = False
    return ember.device("torch", "cuda:0")


OPT_IN = frozenset({"fusion-numba", "fusion-triton"})
"""Backends that run only when ``EMBER_TEST_BACKENDS`` names them, beyond the default
run's budget: numba compiles some 290 kernels over the whole suite (about 200 s of a
core on the 2-core CI machine; it passes), and Triton's interpreter takes about 3
minutes. By default, tests/backends/fusion/ runs representative parts of each:
``test_numba_runtime.py`` (every op in random blocks of every dtype and reductions,
checked against NdArray) and ``test_triton_runtime.py``."""


def _selected() -> list[str]:
    wanted = os.environ.get("EMBER_TEST_BACKENDS")
    if wanted:
        return [b.strip() for b in wanted.split(",")]
    return [b for b in BACKENDS if b not in OPT_IN]


@pytest.fixture(params=_selected())
def device(request) -> ember.Device:
    """A device of the backend under test (default dtypes f32 / i64)."""
    return BACKENDS[request.param]()


@pytest.fixture(params=["one thread", "split"])
def ndarray_threads(request, monkeypatch) -> str:
    """Runs an NdArray kernel test on the calling thread, then with its blocks split over
    three threads (``ember.backends.ndarray.parallel``): the real BLAS may have one thread
    here, and test shapes are far under the size that splits."""
    if request.param == "split":
        from ember.backends.ndarray import parallel

        monkeypatch.setattr(parallel, "MIN_PARALLEL_WORK", 0)
        monkeypatch.setattr(parallel, "_CPUS", 3)
        monkeypatch.setattr(parallel, "blas_threads", lambda: 3)
    return request.param
