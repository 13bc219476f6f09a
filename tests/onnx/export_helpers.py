"""Round trips of exported models: ember -> ONNX -> onnxruntime, and ember -> ONNX -> ember's
importer, each compared with the ember model itself."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from ember.module import Module
from ember.onnx import convert
from ember.onnx.export import export
from ember.tensor import Tensor

RTOL, ATOL = 1e-4, 1e-5


def rand(*shape: int, seed: int = 0, device: Any = None) -> Tensor:
    """Standard normal f32 values of ``shape`` (NdArray unless ``device``)."""
    import ember

    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return Tensor.from_data(values, device or ember.device("ndarray"))


def as_list(out: Any) -> list[np.ndarray]:
    tensors = [out] if isinstance(out, Tensor) else list(out)
    return [np.asarray(t.to_numpy()) for t in tensors]


def run_onnxruntime(path: Path, inputs: Sequence[Tensor]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {n: np.asarray(x.to_numpy()) for n, x in zip(names, inputs, strict=True)})


def assert_close(got: Sequence[np.ndarray], want: Sequence[np.ndarray], what: str,
                 rtol: float = RTOL, atol: float = ATOL) -> None:  # fmt: skip
    assert len(got) == len(want), what
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=what)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=what)


def round_trip(module: Module, inputs: Sequence[Tensor], path: Path, *,
               others: Sequence[Sequence[Tensor]] = (), importer: bool = True,
               rtol: float = RTOL, atol: float = ATOL, **options: Any) -> onnx.ModelProto:  # fmt: skip
    """Exports ``module`` on ``inputs`` and checks onnxruntime (on ``inputs`` and on each
    input set of ``others``, e.g. another batch size) and the importer against ember."""
    written = export(module, list(inputs), path, **options)
    assert written == path and path.is_file()
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    for case in [inputs, *others]:
        want = as_list(module(*case))
        assert_close(run_onnxruntime(path, case), want, f"onnxruntime, shapes "
                     f"{[x.shape for x in case]}", rtol, atol)  # fmt: skip
    if importer:
        imported = convert(path).build(inputs[0].device)
        for case in [inputs, *others]:
            assert_close(as_list(imported(*case)), as_list(module(*case)), "ember import",
                         rtol, atol)  # fmt: skip
    return model
