"""The ONNX backend node test cases shipped in the onnx wheel, and how one case is checked.

Each case is a folder with ``model.onnx`` and ``test_data_set_*/{input,output}_*.pb``.
A case runs when the registry has a converter for every op of its graph: the model is
imported (parse, translate, generate code), the generated module runs on NdArray, and
its outputs are compared with the expected ones.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import cache
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
from onnx import numpy_helper  # noqa: E402

import ember  # noqa: E402
from ember.onnx.importer import convert  # noqa: E402
from ember.onnx.ir import ember_dtype  # noqa: E402
from ember.onnx.registry import canonical_domain, lookup  # noqa: E402

NODE_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"

# Outcomes per op, filled by conftest's report hook and printed at the end of the session.
RESULTS: dict[str, Counter] = {}

# (rtol, atol) per expected dtype; ints and bools compare exactly.
# Their outputs come from NumPy's generator when the cases were made (tests/onnx/test_ops_math.py
# checks Bernoulli's statistics instead).
RANDOM_OPS = {"Bernoulli", "RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike",
              "Multinomial"}  # fmt: skip

TOLERANCE = {
    np.dtype(np.float16): (1e-2, 1e-3),
    np.dtype(np.float32): (1e-4, 1e-5),
    np.dtype(np.float64): (1e-7, 1e-9),
}


def case_names() -> list[str]:
    if not NODE_DIR.is_dir():
        return []
    return sorted(p.name for p in NODE_DIR.iterdir() if (p / "model.onnx").is_file())


@cache
def _op_names() -> list[str]:
    from onnx import defs

    return sorted({s.name for s in defs.get_all_schemas_with_history()}, key=len, reverse=True)


# Case names that do not start with their op's name.
_CASE_ALIASES = {"tril": "Trilu", "triu": "Trilu", "constantpad": "Pad", "edgepad": "Pad", "simplernn": "RNN",
                 "reflectpad": "Pad", "wrappad": "Pad",
                 "batchnorm": "BatchNormalization", "instancenorm": "InstanceNormalization",
                 "mvn": "MeanVarianceNormalization"}  # fmt: skip


@cache
def case_op(case: str) -> str:
    """The op a case tests, from its name: ``test_reduce_sum_keepdims`` -> ``ReduceSum``."""
    key = case.removeprefix("test_").replace("_", "").lower()
    for prefix, op in _CASE_ALIASES.items():
        if key.startswith(prefix):
            return op
    for op in _op_names():
        if key.startswith(op.lower()):
            return op
    return case.removeprefix("test_")


def _why_skip(model) -> str | None:
    """The reason a case cannot run yet (an op without converter, a type ember lacks)."""
    opsets = {canonical_domain(o.domain): o.version for o in model.opset_import}
    for node in model.graph.node:
        if node.op_type in RANDOM_OPS:
            return f"random op {node.op_type}: its values cannot match the reference's generator"
        domain = canonical_domain(node.domain)
        if lookup(node.op_type, domain, opsets.get(domain, 1)) is None:
            return f"unsupported op {node.op_type}"
    for value in [*model.graph.input, *model.graph.output]:
        if not value.type.HasField("tensor_type"):
            return "a sequence, map or optional value (not a tensor)"
        elem = value.type.tensor_type.elem_type
        if ember_dtype(elem) is None:
            name = onnx.TensorProto.DataType.Name(elem)
            return f"dtype {name} has no ember equivalent"
    return None


def _read(path: Path) -> np.ndarray:
    tensor = onnx.TensorProto()
    tensor.ParseFromString(path.read_bytes())
    return np.asarray(numpy_helper.to_array(tensor))


def run_case(case: str) -> None:
    folder = NODE_DIR / case
    model = onnx.load(str(folder / "model.onnx"))
    reason = _why_skip(model)
    if reason is not None:
        pytest.skip(reason)
    conversion = convert(model)
    device = ember.device("ndarray")
    built = conversion.build(device)
    for data_set in sorted(folder.glob("test_data_set_*")):
        inputs = [_read(p) for p in sorted(data_set.glob("input_*.pb"), key=_index)]
        expected = [_read(p) for p in sorted(data_set.glob("output_*.pb"), key=_index)]
        outputs = built(*(ember.Tensor.from_data(x, device) for x in inputs))
        if not isinstance(outputs, tuple):
            outputs = (outputs,)
        assert len(outputs) == len(expected)
        for i, (got, want) in enumerate(zip(outputs, expected)):
            compare(got.to_numpy(), want, f"{case}/{data_set.name} output {i}")


def _index(path: Path) -> int:
    return int(re.search(r"_(\d+)\.pb$", path.name)[1])


def compare(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if want.dtype.type.__module__ == ml_dtypes.__name__:
        # ml_dtypes (bfloat16, float8, 4-bit...) as float32, which holds them exactly and
        # where NaN equals NaN
        got, want = got.astype(np.float32), want.astype(np.float32)
    if want.dtype in TOLERANCE:
        rtol, atol = TOLERANCE[want.dtype]
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


LIGHT_DIR = NODE_DIR.parent / "light"


def light_names() -> list[str]:
    return sorted(p.stem for p in LIGHT_DIR.glob("light_*.onnx")) if LIGHT_DIR.is_dir() else []


def run_light(name: str, output: str | None = None) -> None:
    """A light model graph (real architectures, constant weights): compared with onnxruntime;
    ``output`` names a value of the graph to compare instead of the graph's outputs."""
    ort = pytest.importorskip("onnxruntime")
    model = onnx.load(str(LIGHT_DIR / f"{name}.onnx"))
    if output is not None:
        del model.graph.output[:]
        model.graph.output.append(onnx.helper.make_tensor_value_info(output, onnx.TensorProto.FLOAT, None))
    reason = _why_skip(model)
    if reason is not None:
        pytest.skip(reason)
    conversion = convert(model)
    rng = np.random.default_rng(0)
    feeds = {}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    # Old graphs list their initializers as inputs too; only what the session asks for is fed.
    wanted = {i.name for i in session.get_inputs()}
    for info in model.graph.input:
        if info.name not in wanted:
            continue
        dims = [d.dim_value or 1 for d in info.type.tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)
        feeds[info.name] = rng.standard_normal(dims).astype(dtype)
    expected = session.run(None, feeds)
    device = ember.device("ndarray")
    outputs = conversion.build(device)(*(ember.Tensor.from_data(feeds[n], device)
                                         for n in conversion.input_names))
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    for i, (got, want) in enumerate(zip(outputs, expected)):
        compare(got.to_numpy(), want, f"{name} output {i}")
