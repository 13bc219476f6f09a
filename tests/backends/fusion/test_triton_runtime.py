"""The Triton runtime, through Triton's interpreter on torch CPU tensors (no GPU needed).

Every generated kernel kind runs here on small shapes against a reference: a block's
kernel against the interpreter runtime (NdArray's ops one by one, in NumPy), and whole
models on ``fusion(torch)`` with ``runtime="triton"`` against the unfused Torch backend.
Tolerances: integer, boolean and selection results exactly; float64 within 1e-12
relative; float32 within 2e-6 relative (the kernels' tanh, expm1, log1p, pow and round
are written from ``tl`` builtins, and sums may be ordered differently); float16 within one
of its ulps. Cases that need a GPU skip, saying so, where torch sees none.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ember
from ember import Tensor, activation
from ember.backend.errors import BackendUnavailableError
from ember.backends.fusion import autotune, reset_stats, stats
from ember.backends.fusion.interpreter import InterpreterRuntime
from ember.backends.fusion.ir import Block, Input, Instr
from ember.tensor.dtype import DType

torch = pytest.importorskip("torch")
from ember.backends.fusion import triton_runtime  # noqa: E402 - after torch's skip

if not triton_runtime.available():
    pytest.skip("triton is not installed (pip install 'ember[gpu-jit]')", allow_module_level=True)

import triton_compile_check  # noqa: E402
from triton_compile_check import CompileCheck  # noqa: E402

from ember.backends.fusion.triton_source import KernelUnsupported, generate  # noqa: E402

# The interpreter computes masked-off lanes too (a log of the 0 they load): NumPy's warnings.
pytestmark = pytest.mark.filterwarnings(
    "ignore:(divide by zero|invalid value|overflow) encountered:RuntimeWarning")

F32, F64, F16, I32, I64, I8, B = (DType.F32, DType.F64, DType.F16, DType.I32, DType.I64,
                                  DType.I8, DType.BOOL)  # fmt: skip
TOL = {F32: 2e-6, F64: 1e-12, F16: 1e-3}


@pytest.fixture(scope="module")
def gpu_compile_reason(tmp_path_factory):
    """Why kernels cannot be compiled for a GPU here (None: they can)."""
    reason = triton_compile_check.unavailable_reason(tmp_path_factory.mktemp("probe"))
    if reason is not None:
        print(f"\n{reason}: the Triton runtime's tests run in the interpreter only")
    return reason


@pytest.fixture(scope="module", autouse=True)
def compiled_for_the_gpu(gpu_compile_reason):
    """Every kernel these tests launch in the interpreter is compiled for a GPU too
    (``triton_compile_check``): the interpreter accepts code the compiler refuses."""
    check = CompileCheck()
    if gpu_compile_reason is not None:
        yield check
        return
    with pytest.MonkeyPatch.context() as patch:
        check.install(patch, triton_runtime.TritonRuntime)
        yield check


@pytest.fixture(scope="module")
def rt(tmp_path_factory):
    with triton_runtime.interpreter():
        return triton_runtime.TritonRuntime(cache=tmp_path_factory.mktemp("triton"))


@pytest.fixture(scope="module")
def fused():
    """``fusion(torch)`` whose blocks run as Triton kernels in the interpreter."""
    with triton_runtime.interpreter():
        return ember.device("torch").fusion(runtime="triton")


UNFUSED = ember.device("torch")


def _check(rt, block: Block, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Runs ``block`` on the Triton runtime and the interpreter runtime; compares."""
    expected = InterpreterRuntime().run(block, [a.copy() for a in arrays])
    got = rt.run(block, [torch.from_numpy(a.copy()) for a in arrays])
    for g, e, r in zip(got, expected, block.outputs, strict=True):
        g = g.numpy()
        d = block.register_dtype(r)
        assert g.shape == e.shape and g.dtype == e.dtype
        if d.is_float:
            np.testing.assert_allclose(g, e, rtol=TOL[d], atol=TOL[d], equal_nan=True)
        else:
            np.testing.assert_array_equal(g, e)
    return [g.numpy() for g in got]


def _ew(shape, inputs, body, outputs, axis=None) -> Block:
    return Block(shape, tuple(Input(s, d) for s, d in inputs), tuple(body), outputs, axis)


def _i(op, args, attrs, shape, dtype) -> Instr:
    return Instr(op, args, attrs, shape, dtype)


# ---------------------------------------------------------------------- element-wise
def test_chain_with_broadcasting_and_two_outputs(rt):
    s = (3, 4, 5)
    block = _ew(s, [((3, 1, 5), F32), ((1, 4, 5), F32), ((3, 4, 1), F32)], [
        _i("add", (0, 1), (), s, F32), _i("mul", (3, 2), (), s, F32),
        _i("sub_scalar", (4,), (0.25,), s, F32), _i("exp", (5,), (), s, F32),
        _i("max_pair", (6, 0), (), s, F32),
    ], (4, 7))  # fmt: skip
    rng = np.random.default_rng(0)
    _check(rt, block, [rng.standard_normal(i.shape).astype(np.float32) for i in block.inputs])
    assert "%" not in generate(_ew((6,), [((6,), F32)], [_i("neg", (0,), (), (6,), F32)], (1,)))


def test_an_input_broadcast_everywhere(rt):
    block = _ew((2, 3), [((2, 3), F32), ((1, 1), F32)], [_i("mul", (0, 1), (), (2, 3), F32)], (2,))
    _check(rt, block, [np.arange(6, dtype=np.float32).reshape(2, 3), np.full((1, 1), 3, np.float32)])


_POSITIVE = {"log", "sqrt", "rsqrt"}
UNARY = ["exp", "log", "log1p", "expm1", "erf", "sqrt", "rsqrt", "recip", "sin", "cos", "tan",
         "tanh", "sigmoid", "floor", "ceil", "trunc", "round", "abs", "neg", "sign"]  # fmt: skip


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("op", UNARY)
def test_unary_math(rt, op, dtype):
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(40) * 3, [1e-5, -1e-5, 1e-3, -0.7, 0.5, -2.5, 2.5, 0.0]])
    if op in _POSITIVE:
        x = np.abs(x) + 1e-3
    if op == "log1p":
        x = np.maximum(x, -0.9)
    np_dtype = np.float32 if dtype is F32 else np.float64
    n = x.size
    block = _ew((n,), [((n,), dtype)], [_i(op, (0,), (), (n,), dtype)], (1,))
    _check(rt, block, [x.astype(np_dtype)])


def test_float64_scalars_are_not_rounded_to_float32(rt):
    x = np.linspace(-3, 3, 50)
    block = _ew((50,), [((50,), F64)], [_i("mul_scalar", (0,), (0.1,), (50,), F64)], (1,))
    (got,) = _check(rt, block, [x])
    np.testing.assert_array_equal(got, x * 0.1)


def test_binary_ops_pow_clamp_and_nan(rt):
    n = 12
    x = np.array([-2.0, -1.5, 0.0, 0.5, 1.0, 3.0, np.nan, -0.0, 2.0, -3.0, 4.0, 1e-3], np.float32)
    y = np.array([2.0, 3.0, 0.0, -1.0, 7.5, 0.5, 1.0, 2.0, np.nan, 0.3, -2.0, 1.0], np.float32)
    s = (n,)
    block = _ew(s, [(s, F32), (s, F32)], [
        _i("div", (0, 1), (), s, F32), _i("pow", (0, 1), (), s, F32),
        _i("pow_scalar", (0,), (2.0,), s, F32), _i("min_pair", (0, 1), (), s, F32),
        _i("clamp", (0,), (0.0, None), s, F32), _i("clamp", (0,), (-1.0, 1.0), s, F32),
        _i("is_nan", (0,), (), s, B), _i("is_inf", (2,), (), s, B),
    ], tuple(range(2, 10)))  # fmt: skip
    with np.errstate(all="ignore"):
        _check(rt, block, [x, y])


def test_casts_comparisons_and_selection(rt):
    s = (2, 5)
    x = np.array([[-2.7, -0.5, 0.0, 0.5, 2.7], [1.0, -1.0, 3.9, -3.9, 100.0]], np.float32)
    m = x > 0.25
    block = _ew(s, [(s, F32), (s, B), (s, I64)], [
        _i("cast", (0,), (I32,), s, I32), _i("cast", (2,), (F32,), s, F32),
        _i("cast", (1,), (F32,), s, F32), _i("cast", (0,), (B,), s, B),
        _i("greater_elem", (0,), (0.5,), s, B), _i("equal", (0, 4), (), s, B),
        _i("mask_where", (0, 1, 4), (), s, F32), _i("mask_fill", (0, 1), (-7.0,), s, F32),
        _i("not", (1,), (), s, B), _i("and", (1, 7), (), s, B),
        _i("add_scalar", (2,), (5,), s, I64), _i("bitwise_xor", (2, 13), (), s, I64),
    ], tuple(range(3, 15)))  # fmt: skip
    _check(rt, block, [x, m, np.arange(10, dtype=np.int64).reshape(s) - 4])


@pytest.mark.parametrize("scalar", [3, -3])
def test_int8_arithmetic_wraps_as_numpy(rt, scalar):
    s = (6,)
    block = _ew(s, [(s, I8), (s, I8)], [_i("add", (0, 1), (), s, I8),
                                          _i("mul_scalar", (2,), (scalar,), s, I8)], (2, 3))  # fmt: skip
    a = np.array([100, -100, 127, -128, 5, 0], np.int8)
    _check(rt, block, [a, a])
    # Triton 3.6's launcher reads an int8 argument as an unsigned byte (a negative one
    # raised OverflowError on the GPU): int8 scalars go in as int32.
    assert "s0: tl.int32" in generate(block)


def test_kernels_are_compiled_for_a_gpu(rt, compiled_for_the_gpu, gpu_compile_reason):
    if gpu_compile_reason is not None:
        pytest.skip(gpu_compile_reason)
    s = (9,)
    block = _ew(s, [(s, F32)], [_i("is_inf", (0,), (), s, B)], (1,))  # reads the INF global
    before = len(compiled_for_the_gpu.compiled)
    _check(rt, block, [np.array([0, 1, np.inf, -np.inf, np.nan, 2, 3, 4, 5], np.float32)])
    assert len(compiled_for_the_gpu.compiled) == before + 1


def test_the_compile_check_refuses_what_only_the_interpreter_runs(tmp_path, gpu_compile_reason):
    if gpu_compile_reason is not None:
        pytest.skip(gpu_compile_reason)
    # The header's old form: an annotated float global, which the interpreter reads and the
    # GPU compiler refuses (what the first run on a GPU found).
    source = tmp_path / "old_header.py"
    source.write_text(
        "import triton\nimport triton.language as tl\n\n"
        'INF: tl.constexpr = float("inf")\n\n\n'
        "@triton.jit\ndef kernel(in0, out0, total, BLOCK: tl.constexpr):\n"
        "    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    r0 = tl.load(in0 + idx, mask=idx < total, other=0)\n"
        "    tl.store(out0 + idx, tl.abs(r0) == INF, mask=idx < total)\n"
    )  # fmt: skip
    module = type("Module", (), {"__file__": str(source), "__name__": "old_header"})
    x = torch.zeros(4)
    from triton.compiler.errors import CompilationError

    with pytest.raises(CompilationError, match="global variable INF"):
        CompileCheck().compile(module, (x, torch.zeros(4, dtype=torch.bool), 4), {"BLOCK": 4})


def test_float16_rounds_each_result(rt):
    s = (32,)
    block = _ew(s, [(s, F16), (s, F16)], [_i("mul", (0, 1), (), s, F16),
                                           _i("add_scalar", (2,), (1.0,), s, F16),
                                           _i("exp", (3,), (), s, F16)], (4,))  # fmt: skip
    rng = np.random.default_rng(2)
    _check(rt, block, [rng.standard_normal(s).astype(np.float16) for _ in range(2)])


def test_ops_without_a_rule_are_refused(rt):
    s = (4,)
    for op, dtype in (("atan2", F32), ("remainder", F32), ("div", I64), ("sinh", F32)):
        n_args = 1 if op == "sinh" else 2
        block = _ew(s, [(s, dtype)] * n_args, [_i(op, tuple(range(n_args)), (), s, dtype)],
                    (n_args,))  # fmt: skip
        with pytest.raises(KernelUnsupported):
            rt.run(block, [torch.ones(s, dtype=torch.float32 if dtype is F32 else torch.int64)]
                   * n_args)  # fmt: skip


# ---------------------------------------------------------------------- reductions
@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("op", ["sum_dim", "mean_dim", "max_dim", "min_dim", "prod_dim"])
def test_reductions_over_any_axis(rt, op, axis):
    s = (3, 70, 5) if axis == 1 else (3, 4, 70) if axis == 2 else (70, 3, 4)
    r = tuple(1 if d == axis else n for d, n in enumerate(s))
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(s) * (0.2 if op == "prod_dim" else 1) + (1 if op == "prod_dim" else 0))
    x = x.astype(np.float32)
    if op in ("max_dim", "min_dim"):
        x[0, 0, 0] = np.nan  # NaN wins, as in NumPy
    block = _ew(s, [(s, F32)], [_i(op, (0,), (axis,), r, F32), _i("sub", (0, 1), (), s, F32)],
                (1, 2), axis)  # fmt: skip
    _check(rt, block, [x])


def test_integer_sums_and_means(rt):
    s = (4, 9)
    block = _ew(s, [(s, I32)], [_i("sum_dim", (0,), (1,), (4, 1), I32),
                                 _i("max_dim", (0,), (1,), (4, 1), I32)], (1, 2), 1)  # fmt: skip
    _check(rt, block, [np.arange(36, dtype=np.int32).reshape(s) * 1000003])


def test_variance_and_layer_norm_block(rt):
    # Data of mean 100 and deviation 3: one float32 ulp of the mean (7.6e-6) moves every
    # normalized value by 2.5e-6, so the comparison allows a few of those.
    s, r = (5, 300), (5, 1)
    block = _ew(s, [(s, F32), ((1, 300), F32)], [
        _i("mean_dim", (0,), (1,), r, F32), _i("sub", (0, 2), (), s, F32),
        _i("mul", (3, 3), (), s, F32), _i("mean_dim", (4,), (1,), r, F32),
        _i("add_scalar", (5,), (1e-5,), r, F32), _i("rsqrt", (6,), (), r, F32),
        _i("mul", (3, 7), (), s, F32), _i("mul", (8, 1), (), s, F32),
    ], (5, 9), 1)  # fmt: skip
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(s) * 3 + 100).astype(np.float32)
    gamma = rng.standard_normal((1, 300)).astype(np.float32)
    got = rt.run(block, [torch.from_numpy(x), torch.from_numpy(gamma)])
    x64 = x.astype(np.float64)
    var = x64.var(1, keepdims=True)
    np.testing.assert_allclose(got[0].numpy(), var, rtol=1e-5)
    y = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(var + 1e-5) * gamma
    np.testing.assert_allclose(got[1].numpy(), y, rtol=1e-5, atol=2e-5)


# ---------------------------------------------------------------------- through the device
def _run_both(fused, make) -> tuple[np.ndarray, np.ndarray, dict]:
    """``make(device)`` on the fused device and on plain torch; the stats of the fused run."""
    reset_stats()
    got = make(fused).to_numpy()
    counts = stats()
    expected = make(UNFUSED).to_numpy()
    return got, expected, counts


def _data(shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


MODELS = {
    "softmax": lambda x, d: activation.softmax(x, 1),
    "log_softmax": lambda x, d: activation.log_softmax(x, -1),
    "gelu": lambda x, d: activation.gelu(x),
    "mean_var": lambda x, d: x.var(1) + x.mean_dim(1),
    "layer_norm": lambda x, d: ember.nn.LayerNormConfig(37).init(d)(x),
    "rms_norm": lambda x, d: ember.nn.RmsNormConfig(37).init(d)(x),
}


@pytest.mark.parametrize("model", list(MODELS))
def test_models_fuse_and_match_unfused_torch(fused, model):
    x = _data((6, 37), seed=5, scale=3)
    got, expected, counts = _run_both(fused, lambda d: MODELS[model](Tensor.from_data(x, d), d))
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=2e-6)
    assert counts["kernels"] >= 1 and counts["fused_ops"] >= 2, counts


def test_cross_entropy(fused):
    x = _data((8, 11), seed=6, scale=4)
    targets = np.random.default_rng(6).integers(0, 11, 8)

    def make(d):
        loss = ember.nn.CrossEntropyLossConfig().init(d)
        return loss(Tensor.from_data(x, d), Tensor.from_data(targets, d))

    got, expected, counts = _run_both(fused, make)
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=2e-6)
    assert counts["kernels"] >= 1, counts


def test_unsupported_ops_run_unfused(fused):
    x, y = _data((4, 5), 7), _data((4, 5), 8) + 3
    got, expected, counts = _run_both(
        fused, lambda d: (Tensor.from_data(x, d) * 2.0).atan2(Tensor.from_data(y, d)) + 1.0)
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-6)
    assert counts["unfused_ops"] >= 1


# ---------------------------------------------------------------------- matmul epilogues
EPILOGUES = {
    "bias": lambda y, b, r: y + b,
    "bias_relu": lambda y, b, r: activation.relu(y + b),
    "bias_gelu": lambda y, b, r: activation.gelu(y + b),
    "clamp": lambda y, b, r: y.clamp(-0.5, 0.5),
    "bias_relu_residual": lambda y, b, r: activation.relu(y + b) + r,
}


@pytest.mark.parametrize("batch", [(), (2,)])
@pytest.mark.parametrize("epilogue", list(EPILOGUES))
def test_matmul_with_epilogue(fused, epilogue, batch):
    x, w = _data((*batch, 20, 24), 9), _data((24, 40), 10, 0.2)
    bias, res = _data((40,), 11), _data((*batch, 20, 40), 12)

    def make(d):
        t = lambda a: Tensor.from_data(a, d)  # noqa: E731
        return EPILOGUES[epilogue](t(x).matmul(t(w)), t(bias), t(res))

    got, expected, counts = _run_both(fused, make)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert counts["kernels"] == 1 and counts["unfused_ops"] == 0, counts


def test_matmul_whose_product_is_read_later_writes_it_too(fused):
    x, w, bias = _data((9, 16), 13), _data((16, 33), 14), _data((33,), 15)

    reset_stats()
    d = fused
    y = Tensor.from_data(x, d).matmul(Tensor.from_data(w, d))
    z = activation.relu(y + Tensor.from_data(bias, d))
    got_z, got_y = z.to_numpy(), y.to_numpy()
    assert stats()["kernels"] == 1, stats()
    np.testing.assert_allclose(got_y, x @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_z, np.maximum(x @ w + bias, 0), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------- random graphs
_UNARY_G = ["exp", "neg", "abs", "tanh", "sigmoid", "relu", "square"]
_BINARY_G = ["add", "sub", "mul", "max"]


@st.composite
def graphs(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    steps = draw(st.lists(st.tuples(st.sampled_from(["unary", "binary", "scalar", "reduce"]),
                                    st.integers(0, 100), st.integers(0, 100),
                                    st.sampled_from(_UNARY_G + _BINARY_G)),
                          min_size=1, max_size=6))  # fmt: skip
    # a second input broadcast along some dims
    other = tuple(n if draw(st.booleans()) else 1 for n in shape)
    return shape, other, steps


def _graph(d, shape, other, steps, x, y):
    # A chain from x (of the full shape); the other operand of a binary op is any earlier
    # value (y broadcasts), and a reduction's result is used at the full shape again, so
    # every segment the fusers cut holds two records or more.
    values = [Tensor.from_data(y, d), Tensor.from_data(x, d)]
    for kind, a, b, name in steps:
        u = values[-1]  # a chain (the other operand of a binary op is any earlier value)
        if kind == "unary":
            op = name if name in _UNARY_G else "abs"
            u = {"exp": lambda t: (t.clamp(-5, 5)).exp(), "neg": lambda t: -t,
                 "abs": lambda t: t.abs(), "tanh": activation.tanh,
                 "sigmoid": activation.sigmoid, "relu": activation.relu,
                 "square": lambda t: t * t}[op](u)  # fmt: skip
        elif kind == "binary":
            v = values[b % len(values)]
            u = {"add": lambda p, q: p + q, "sub": lambda p, q: p - q,
                 "mul": lambda p, q: p * q,
                 "max": lambda p, q: p.max_pair(q),
                 }.get(name, lambda p, q: p + q)(u, v)  # fmt: skip
        elif kind == "scalar":
            u = u * 0.5 + 1.25
        else:
            dim = b % len(shape)
            u = u - u.mean_dim(dim) if a % 2 else u * (u.sum_dim(dim) * 0.01)
        values.append(u)
    return values[-1]


@settings(max_examples=25, deadline=None)
@given(graphs())
def test_random_graphs_fuse_and_match(graph):
    shape, other, steps = graph
    with triton_runtime.interpreter():
        fused = ember.device("torch").fusion(runtime="triton")
    x, y = _data(shape, 16), _data(other, 17)
    got, expected, counts = _run_both(fused, lambda d: _graph(d, shape, other, steps, x, y))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    if counts["records"] >= 2:  # (a lone op is not worth a block)
        assert counts["kernels"] >= 1 and counts["unfused_ops"] == 0, counts


# ---------------------------------------------------------------------- autotune
class _Tuned(triton_runtime.TritonRuntime):
    """The interpreter runtime, tuned as on a GPU (its timings mean nothing: the test
    checks the mechanism, never which candidate wins)."""

    tunes = True

    def __init__(self, cache) -> None:
        super().__init__(cache)
        self.tunes = True

    def machine(self) -> str:
        return "test-gpu"


def test_launch_configurations_are_tuned_and_persisted(tmp_path):
    assert autotune.tuner_for(_make_interpreted(tmp_path)) is None  # interpreter: no tuning
    with triton_runtime.interpreter():
        runtime = _Tuned(tmp_path)
    tuner = autotune.Tuner(runtime, tmp_path)
    s = (64, 64)
    block = _ew(s, [(s, F32)], [_i("exp", (0,), (), s, F32)], (1,))
    pending = tuner.lookup(block)
    assert type(pending) is autotune.Pending
    x = torch.randn(s)
    choice = tuner.tune(pending, block, [x], lambda: torch.exp(x))
    assert choice == autotune.UNFUSED or choice.config in triton_runtime.LABELS
    again = autotune.Tuner(runtime, tmp_path).lookup(block)
    assert again.earlier == autotune.Stored(choice)  # read back from the file, to be checked
    document = json.loads(tuner.path.read_text())
    assert document["machine"] == "test-gpu"
    # A label the runtime does not have is ignored, as any malformed entry.
    entry = next(iter(document["choices"]))
    counts = {"tunings": 2, "streak": 2}
    assert autotune._parse_entry(entry, {"run": "fused", "threads": 1, "config": "b7w1s1",
                                         **counts}, triton_runtime.LABELS) is None  # fmt: skip
    stored = autotune._parse_entry(entry, {"run": "fused", "threads": 1, "config": "b1024w4s1",
                                           **counts}, triton_runtime.LABELS)  # fmt: skip
    assert stored == autotune.Stored(autotune.Choice("fused", 1, "b1024w4s1"), 2, 2)


def test_the_executor_tunes_blocks_and_matmul_epilogues(tmp_path):
    from ember.backends.fusion.executor import Executor

    with triton_runtime.interpreter():
        runtime = _Tuned(tmp_path)
        device = ember.device("torch").fusion(runtime="triton")
    device.backend.executor = Executor(device.backend.inner, runtime)
    # Sizes of the smallest buckets tuned (4096 elements; few programs: the interpreter)
    x, w, b = _data((4, 16), 21), _data((16, 1024), 22, 0.1), _data((1024,), 23)

    def model(d):
        t = lambda a: Tensor.from_data(a, d)  # noqa: E731
        h = activation.relu(t(x).matmul(t(w)) + t(b))  # a matmul epilogue
        return activation.softmax(h * 2.0, 1)  # a block of 4 x 1024 elements

    for run in range(2):  # the first run tunes each kind, the second uses the choices
        got, expected, counts = _run_both(device, model)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        assert counts["tunings"] == (2 if run == 0 else 0), counts
    choices = json.loads((runtime.cache / "autotune-test-gpu.json").read_text())["choices"]
    assert len(choices) == 2, choices  # the block's and the matmul epilogue's
    for value in choices.values():
        assert value["run"] == "unfused" or value["config"] in triton_runtime.LABELS, value


def _make_interpreted(tmp_path):
    with triton_runtime.interpreter():
        return triton_runtime.TritonRuntime(tmp_path)


# ---------------------------------------------------------------------- availability
def test_without_triton_the_runtime_names_the_extra(monkeypatch):
    from ember.backends.fusion.executor import runtime_named

    monkeypatch.setattr(triton_runtime, "triton", None)
    with pytest.raises(BackendUnavailableError, match=r"ember\[gpu-jit\]"):
        runtime_named("triton")
    with pytest.raises(BackendUnavailableError, match=r"ember\[gpu-jit\]"):
        ember.device("torch").fusion(runtime="triton")


def test_without_a_gpu_the_runtime_says_so(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendUnavailableError, match="CUDA GPU"):
        triton_runtime.TritonRuntime()


def test_cuda_fusion_says_why_it_cannot_use_triton(monkeypatch):
    from ember.backend.device import Device
    from ember.backends.fusion import backend

    cuda = Device(ember.device("torch").backend, "cuda", 0)  # made without a GPU to check
    with triton_runtime.interpreter(), pytest.raises(BackendUnavailableError, match="interpreter"):
        cuda.fusion(runtime="triton")
    monkeypatch.setattr(triton_runtime, "triton", None)
    monkeypatch.setattr(backend, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cuda.fusion(runtime="interpreter")  # asked for: no warning
        cuda.fusion()
    assert [str(w.message) for w in caught if "gpu-jit" in str(w.message)], caught


def test_cuda_fusion_needs_no_numba(monkeypatch):
    from ember.backend.device import Device
    from ember.backends.fusion import executor, numba_runtime

    monkeypatch.setattr(numba_runtime, "available", lambda: False)
    monkeypatch.setattr(executor, "_shared", {})
    monkeypatch.delenv("EMBER_FUSION_RUNTIME", raising=False)
    with pytest.raises(BackendUnavailableError, match=r"ember\[jit\]"):
        ember.device("torch").fusion()  # CPU values want numba by default
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no GPU here: it warns that cuda runs unfused
        Device(ember.device("torch").backend, "cuda", 0).fusion()  # Triton's alone


def test_a_gpu_runtime_adds_the_matmul_fuser_to_the_plan_keys(rt):
    from ember.backends.fusion.executor import Executor
    from ember.backends.fusion.interpreter import InterpreterRuntime

    executor = Executor(ember.device("torch").backend, InterpreterRuntime())
    assert "matmul+epilogue" not in executor.explorer.names
    executor.use_gpu(rt)  # as Fusion.placed does on torch:cuda
    assert executor.explorer.names[-1] == "matmul+epilogue"
    assert len(executor.explorer.fusers) == len(executor.explorer.names)


# ---------------------------------------------------------------------- on a GPU
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA GPU: the compiled Triton kernels run only where torch sees one")
def test_on_the_gpu_against_torch():
    d = ember.device("torch", "cuda").fusion(runtime="triton")
    x = _data((64, 1000), 18, 3)
    w, b = _data((1000, 96), 19, 0.05), _data((96,), 20)

    def run(dev):
        t = Tensor.from_data(x, dev)
        soft = activation.softmax(t, 1)
        lin = activation.gelu(t.matmul(Tensor.from_data(w, dev)) + Tensor.from_data(b, dev))
        return soft.to_numpy(), lin.to_numpy()

    for got, expected in zip(run(d), run(ember.device("torch", "cuda")), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
