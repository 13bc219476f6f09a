"""The numba conv2d kernels against NdArray's im2col conv2d and a float64 NumPy reference.

Every case is compared with the exact result up to a bound on rounding: ``TOL[dtype]``
times the convolution of the magnitudes (``|x| * |w| + |b|``), which bounds how far any
order of adding the products can stray.
"""

from __future__ import annotations

import dataclasses
import threading

import ml_dtypes
import numpy as np
import pytest
from conv_cases import random_case
from numpy.lib.stride_tricks import sliding_window_view

from ember.backend.errors import ShapeError, UnsupportedError
from ember.backend.options import ConvOptions
from ember.backends.ndarray import conv as ndarray_conv

numba_conv = pytest.importorskip("ember.backends.fusion.numba_conv")
pytest.importorskip("numba")

# Rounding per product summed, relative to the sum of magnitudes (a few hundred terms at most).
TOL = {np.float32: 2e-6, np.float64: 1e-14}


def reference(x, w, b, stride, padding, dilation, groups):
    """Float64 cross-correlation by sliding windows (no code shared with the kernels)."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    w = w.astype(np.float64)
    o, cg, kh, kw = w.shape
    span = (dh * (kh - 1) + 1, dw * (kw - 1) + 1)
    win = sliding_window_view(x, span, axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    og = o // groups
    out = np.concatenate(
        [
            np.einsum("nchwij,ocij->nohw", win[:, g * cg : (g + 1) * cg], w[g * og : (g + 1) * og])
            for g in range(groups)
        ],
        axis=1,
    )
    if b is not None:
        out += b.astype(np.float64).reshape(1, o, 1, 1)
    return out


def check(x, w, b, options, dtype):
    got = numba_conv.conv2d(x, w, b, options)
    assert got.dtype == dtype and got.flags.c_contiguous
    args = (options.stride, options.padding, options.dilation, options.groups)
    exact = reference(x, w, b, *args)
    assert got.shape == exact.shape
    bound = reference(np.abs(x), np.abs(w), None if b is None else np.abs(b), *args)
    limit = TOL[dtype] * bound + np.finfo(dtype).tiny
    np.testing.assert_array_less(np.abs(got - exact), limit)
    im2col = ndarray_conv.conv2d(x, w, b, options)
    np.testing.assert_array_less(np.abs(got - im2col.astype(np.float64)), 2 * limit)
    return got


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_random_sweep(dtype):
    rng = np.random.default_rng(14)
    for _ in range(60):
        xs, ws, stride, padding, dilation, groups = random_case(rng)
        x = rng.standard_normal(xs).astype(dtype)
        w = rng.standard_normal(ws).astype(dtype)
        b = rng.standard_normal(ws[0]).astype(dtype) if rng.random() < 0.7 else None
        check(x, w, b, ConvOptions(stride, padding, dilation, groups), dtype)


def _arrays(seed: int, xs: tuple, ws: tuple, dtype) -> tuple[np.ndarray, ...]:
    """A random input, weight and bias of those shapes."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(dtype) for s in (xs, ws, ws[0]))


CASES = [
    # (input, weight, stride, padding, dilation, groups)
    ((3, 1, 28, 28), (8, 1, 3, 3), (1, 1), (0, 0), (1, 1), 1),  # guide CNN, first layer
    ((2, 8, 26, 26), (16, 8, 3, 3), (1, 1), (0, 0), (1, 1), 1),  # guide CNN, second layer
    ((2, 32, 16, 16), (64, 32, 3, 3), (2, 2), (1, 1), (1, 1), 1),  # stride 2
    ((2, 32, 12, 12), (64, 32, 1, 1), (2, 2), (0, 0), (1, 1), 1),  # 1x1, stride 2
    ((2, 12, 9, 9), (12, 1, 3, 3), (1, 1), (1, 1), (1, 1), 12),  # depthwise
    ((2, 6, 9, 9), (12, 1, 3, 3), (2, 1), (1, 2), (1, 1), 6),  # depthwise, multiplier 2
    ((1, 3, 2, 3), (5, 3, 5, 5), (1, 1), (2, 2), (1, 1), 1),  # kernel larger than input
    ((1, 2, 5, 40), (4, 2, 1, 7), (1, 3), (0, 3), (1, 2), 1),  # asymmetric everything
    ((1, 4, 70, 3), (6, 4, 3, 1), (1, 1), (1, 0), (1, 1), 1),  # many short rows, many tiles
    ((1, 3, 9, 11), (8, 3, 3, 3), (2, 2), (1, 1), (2, 2), 1),  # one phase of four, odd width
    ((2, 4, 9, 7), (8, 4, 1, 1), (2, 2), (0, 1), (1, 1), 1),  # 1x1 at stride 2, padded columns
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}s{c[2]}p{c[3]}g{c[5]}")
def test_named_shapes(case, dtype):
    xs, ws, stride, padding, dilation, groups = case
    x, w, b = _arrays(1, xs, ws, dtype)
    check(x, w, b, ConvOptions(stride, padding, dilation, groups), dtype)


ROW_VECTOR_CASES = [
    # Rows whose valid columns fill whole vectors with a padding column between them: the
    # tiles take each row's vectors and skip that column (``_spans``).
    ((2, 16, 32, 32), (16, 16, 3, 3), (1, 1), (1, 1), 1),  # 32 wide: 2 vectors a row
    ((2, 8, 16, 16), (24, 8, 3, 3), (1, 1), (1, 1), 1),  # 16 wide: a span is 3 rows
    ((1, 8, 32, 32), (16, 8, 3, 3), (2, 2), (1, 1), 1),  # stride 2 onto 16 wide
    ((2, 4, 48, 48), (8, 2, 3, 3), (1, 1), (1, 1), 2),  # 48 wide (3 vectors), 2 groups
    ((1, 3, 70, 16), (8, 3, 3, 3), (1, 1), (1, 1), 1),  # many row tiles of 16 wide
    ((1, 4, 8, 8), (8, 4, 3, 3), (1, 1), (1, 1), 1),  # 8 wide: float64's whole vector
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ROW_VECTOR_CASES, ids=lambda c: f"{c[0]}x{c[1]}s{c[2]}g{c[4]}")
def test_rows_of_whole_vectors_skip_their_padding_column(case, dtype):
    xs, ws, stride, padding, groups = case
    x, w, b = _arrays(6, xs, ws, dtype)
    options = ConvOptions(stride, padding, (1, 1), groups)
    got = check(x, w, b, options, dtype)
    for parts in (2, 3):  # the same bits on any number of parts
        np.testing.assert_array_equal(numba_conv.conv2d(x, w, b, options, threads=parts), got)


DIRECT_CASES = [
    # (input, weight, stride, padding, groups, whether float32's tiles store the outputs
    # themselves with AVX-512: whole blocks of 8 channels over whole vectors of a row)
    ((2, 16, 32, 32), (16, 16, 3, 3), (1, 1), (1, 1), 1, True),  # rows of 2 vectors
    ((2, 8, 16, 16), (24, 8, 3, 3), (1, 1), (1, 1), 1, True),  # 16 wide, 3 blocks
    ((1, 8, 32, 32), (16, 8, 3, 3), (2, 2), (1, 1), 1, True),  # stride 2 onto 16 wide
    ((2, 32, 16, 16), (64, 32, 1, 1), (2, 2), (0, 0), 1, True),  # 1x1: full rows are the output
    ((1, 4, 12, 12), (8, 4, 1, 1), (1, 1), (0, 0), 1, True),  # 1x1, 144 positions: 9 vectors
    ((1, 4, 10, 10), (8, 4, 1, 1), (1, 1), (0, 0), 1, False),  # 100 positions: a part vector
    ((2, 4, 48, 48), (16, 2, 3, 3), (1, 1), (1, 1), 2, True),  # 2 groups of 8 channels
    ((2, 4, 48, 48), (8, 2, 3, 3), (1, 1), (1, 1), 2, False),  # groups of 4: padded blocks
    ((2, 8, 20, 20), (16, 8, 3, 3), (1, 1), (1, 1), 1, False),  # 20 wide: a part vector
    ((1, 3, 70, 16), (16, 3, 3, 3), (1, 1), (1, 1), 1, True),  # many row tiles
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", DIRECT_CASES, ids=lambda c: f"{c[0]}x{c[1]}s{c[2]}g{c[4]}")
def test_tiles_that_store_outputs_equal_the_epilogue_pass(case, dtype):
    xs, ws, stride, padding, groups, direct = case
    x, w, b = _arrays(15, xs, ws, dtype)
    x[0, 0, 2, 3] = np.nan  # a NaN's outputs stay NaN through the clamps
    options = ConvOptions(stride, padding, (1, 1), groups)
    plain = numba_conv.prepare(x, w, b, options, 1)
    if dtype == np.float32 and numba_conv.TILE_OB == 8:  # the AVX-512 geometry
        assert plain.after[-1] is direct
    residual = np.random.default_rng(16).standard_normal(plain.out_shape).astype(dtype)
    with_relu = ((0.0, None), (None, 2.0))
    for threads in (1, 2, 3):  # the same bits on any number of parts
        launch = numba_conv.prepare(x, w, b, options, threads, with_relu)
        buffered = dataclasses.replace(launch, after=(*launch.after[:-1], False))
        got = numba_conv.run(launch, x, np.empty, residual)
        np.testing.assert_array_equal(got, numba_conv.run(buffered, x, np.empty, residual))
        sums = numba_conv.run(plain, x)
        np.testing.assert_array_equal(got, np.minimum(np.maximum(sums, 0.0) + residual, 2.0))
    x[0, 0, 2, 3] = 0.0
    check(x, w, b, options, dtype)  # and the plain convolution against float64


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_non_contiguous_input_is_read_in_place(dtype):
    rng = np.random.default_rng(2)
    base = rng.standard_normal((2, 16, 11, 9)).astype(dtype)
    x = base.transpose(0, 1, 3, 2)[:, ::2]  # [2, 8, 9, 11], strided in every dim but n
    assert not x.flags.c_contiguous
    w = rng.standard_normal((8, 4, 3, 2)).astype(dtype)[:, ::-1]  # negative strides
    options = ConvOptions((1, 2), (1, 1), (2, 1), 2)
    got = check(x, w, None, options, dtype)
    np.testing.assert_array_equal(got, numba_conv.conv2d(np.ascontiguousarray(x), w, None, options))


def test_read_only_and_writable_inputs_share_one_compiled_kernel():
    # A step's input is read-only, an activation writable: one compile serves both
    import numba

    kernels = [f for f in vars(numba_conv).values()
               if isinstance(f, numba.core.registry.CPUDispatcher)]  # fmt: skip
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)
    for w in (rng.standard_normal((16, 3, 3, 3)), rng.standard_normal((4, 3, 3, 3))):  # tiled, single
        w, b = w.astype(np.float32), rng.standard_normal(w.shape[0]).astype(np.float32)
        options = ConvOptions((1, 1), (1, 1), (1, 1), 1)
        want = numba_conv.conv2d(x, w, b, options, threads=1)
        compiled = sum(len(f.signatures) for f in kernels)
        view = x.view()
        view.flags.writeable = False
        np.testing.assert_array_equal(numba_conv.conv2d(view, w, b, options, threads=1), want)
        assert sum(len(f.signatures) for f in kernels) == compiled
        assert x.flags.writeable


def test_parts_split_the_tasks_without_changing_a_bit():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 8, 13, 10)).astype(np.float32)
    for w, groups in [
        (rng.standard_normal((9, 8, 3, 3)), 1),
        (rng.standard_normal((8, 1, 3, 3)), 8),
    ]:
        w = w.astype(np.float32)
        options = ConvOptions((1, 1), (1, 1), (1, 1), groups)
        one = numba_conv.conv2d(x, w, None, options, threads=1)
        for parts in (2, 3, 7, 200):  # more parts than tasks too
            np.testing.assert_array_equal(
                numba_conv.conv2d(x, w, None, options, threads=parts), one
            )


def test_parts_that_claim_samples_take_each_once_in_any_order(monkeypatch):
    # The forward kernel runs a call a thread, each taking one sample's (and group's) tiles
    # at a time from a counter they share: run one after another, last call first, the
    # last claims every sample but the others' own, and the output has one part's bits.

    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 16, 70, 20)).astype(np.float32)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    options = ConvOptions((1, 1), (1, 1), (1, 1), 2)
    geometry = numba_conv._geometry(x.shape, w.shape, 2, (1, 1), (1, 1), (1, 1), 4)
    assert geometry.rows_per_tile < geometry.oh  # several tiles a sample
    one = numba_conv.conv2d(x, w, b, options, threads=1)
    launches = []

    def in_reverse(kernel, args, parts, threads=None, calls=None):
        launches.append(args)
        for part in reversed(range(min(calls or parts, parts))):  # the runtime makes `calls` calls
            kernel(*args, part, parts)

    monkeypatch.setattr(numba_conv, "_run_parts", in_reverse)
    for parts in (2, 4):
        launches.clear()
        np.testing.assert_array_equal(numba_conv.conv2d(x, w, b, options, threads=parts), one)
        (args,) = launches
        assert args[-1][1] == 3 * 2 + parts  # start, a claim a sample


def test_inputs_are_not_written():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    copies = [a.copy() for a in (x, w, b)]
    numba_conv.conv2d(x, w, b, ConvOptions((1, 1), (1, 1), (1, 1), 1))
    for a, c in zip((x, w, b), copies):
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.int32])
def test_other_dtypes_raise_a_typed_error(dtype):
    x = np.ones((1, 2, 5, 5), dtype)
    w = np.ones((2, 2, 3, 3), dtype)
    with pytest.raises(numba_conv.KernelUnsupported, match="dtype"):
        numba_conv.conv2d(x, w, None, ConvOptions((1, 1), (0, 0), (1, 1), 1))
    assert issubclass(numba_conv.KernelUnsupported, UnsupportedError)


def test_shapes_that_do_not_convolve_raise_shape_errors():
    x = np.ones((1, 4, 3, 3), np.float32)
    with pytest.raises(ShapeError, match="larger than the padded input"):
        numba_conv.conv2d(x, np.ones((2, 4, 5, 5), np.float32), None,
                          ConvOptions((1, 1), (0, 0), (1, 1), 1))  # fmt: skip
    with pytest.raises(ShapeError, match="groups=3"):
        numba_conv.conv2d(x, np.ones((3, 1, 1, 1), np.float32), None,
                          ConvOptions((1, 1), (0, 0), (1, 1), 3))  # fmt: skip


def test_empty_batch():
    out = numba_conv.conv2d(np.ones((0, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32),
                            None, ConvOptions((1, 1), (0, 0), (1, 1), 1))  # fmt: skip
    assert out.shape == (0, 3, 3, 3) and out.dtype == np.float32


def test_supports_names_what_conv2d_takes():
    w = np.ones((2, 2, 3, 3), np.float32)
    assert numba_conv.supports(np.ones((1, 2, 5, 5), np.float32), w)
    assert numba_conv.supports(np.ones((1, 2, 5, 5), np.float64), w)
    assert not numba_conv.supports(np.ones((1, 2, 5, 5), np.float16), w)
    assert not numba_conv.supports(np.ones((2, 5, 5), np.float32), w)


def _read_only(array):
    array.flags.writeable = False
    return array


def test_a_weight_nothing_can_change_is_packed_once():
    # Loaded records and imported models hold read-only weights: their blocks are packed on
    # the first call and reused while the weight lives.
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 8, 7, 7)).astype(np.float32)
    w = _read_only(rng.standard_normal((12, 8, 3, 3)).astype(np.float32))
    options = ConvOptions((1, 1), (1, 1), (1, 1), 1)
    geometry = numba_conv._geometry(x.shape, w.shape, 1, (1, 1), (1, 1), (1, 1), 4)
    first = numba_conv.packed_weight(w, np.dtype(np.float32), geometry)
    assert numba_conv.packed_weight(w, np.dtype(np.float32), geometry).base is first.base
    got = check(x, w, None, options, np.float32)
    np.testing.assert_array_equal(got, numba_conv.conv2d(x, w.copy(), None, options))
    key = id(w)
    assert key in numba_conv._packed
    del w
    assert key not in numba_conv._packed  # its death drops the blocks


def test_one_read_only_weight_in_two_groupings():
    # [8, 4, 3, 3] convolves 4 channels at groups=1 and 8 at groups=2: the blocks differ.
    rng = np.random.default_rng(8)
    w = _read_only(rng.standard_normal((8, 4, 3, 3)).astype(np.float32))
    for channels, groups in [(4, 1), (8, 2), (4, 1)]:
        x = rng.standard_normal((2, channels, 6, 6)).astype(np.float32)
        check(x, w, None, ConvOptions((1, 1), (1, 1), (1, 1), groups), np.float32)


@pytest.mark.parametrize("how", ["writable", "read-only view of a writable array"])
def test_a_weight_that_can_change_is_packed_on_every_call(how):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    owner = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    w = owner if how == "writable" else _read_only(owner[:])
    options = ConvOptions((1, 1), (1, 1), (1, 1), 1)
    before = numba_conv.conv2d(x, w, None, options)
    owner *= -2.0  # changed in place between two calls
    after = check(x, w, None, options, np.float32)
    np.testing.assert_allclose(after, -2.0 * before, rtol=1e-6, atol=1e-5)
    assert id(w) not in numba_conv._packed


@pytest.fixture
def no_packed_weights():
    numba_conv._packed.clear()
    numba_conv._packed_bytes = 0
    yield
    numba_conv._packed.clear()
    numba_conv._packed_bytes = 0


def test_packed_weights_kept_are_bounded(monkeypatch, no_packed_weights):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    options = ConvOptions((1, 1), (0, 0), (1, 1), 1)
    weights = [_read_only(rng.standard_normal((8, 4, 3, 3)).astype(np.float32))
               for _ in range(5)]  # fmt: skip
    monkeypatch.setattr(numba_conv, "PACKED_CACHE_BYTES", 3 * 8 * 36 * 4)  # three layers' blocks
    for w in weights:
        check(x, w, None, options, np.float32)
    assert list(numba_conv._packed) == [id(w) for w in weights[2:]]  # the oldest went first
    assert numba_conv._packed_bytes == 3 * 8 * 36 * 4


def test_a_weight_that_dies_while_the_cache_is_locked_is_forgotten(no_packed_weights):
    # A weight's weak reference calls back when the weight dies, which may happen inside
    # packed_weight with the cache's lock held by that same thread (the collector runs
    # wherever an allocation triggers it): the callback must not wait for that lock.
    w = _read_only(np.ones((8, 4, 3, 3), np.float32))
    geometry = numba_conv._geometry((1, 4, 5, 5), w.shape, 1, (1, 1), (0, 0), (1, 1), 4)
    numba_conv.packed_weight(w, np.dtype(np.float32), geometry)
    key = id(w)
    holder = [w]
    del w
    done = []

    def drop_while_locked():
        with numba_conv._packed_lock:
            holder.clear()  # the weight's last reference: its callback runs here
            done.append(key not in numba_conv._packed)

    worker = threading.Thread(target=drop_while_locked, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert done == [True], "the weak reference's callback blocked on the cache's lock"


@pytest.mark.parametrize("channels", [16, 2])  # the tiled kernel, and the one-channel one
def test_a_prepared_launch_runs_again_on_new_inputs(channels):
    rng = np.random.default_rng(11)
    w = rng.standard_normal((channels, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(channels).astype(np.float32)
    options = ConvOptions((1, 1), (1, 1), (1, 1), 1)
    x0 = rng.standard_normal((2, 4, 9, 9)).astype(np.float32)
    launch = numba_conv.prepare(x0, w, b, options, 1)
    for seed in range(3):  # new inputs of the prepared shape: each convolved afresh
        x = np.random.default_rng(seed).standard_normal(x0.shape).astype(np.float32)
        np.testing.assert_array_equal(numba_conv.run(launch, x),
                                      numba_conv.conv2d(x, w, b, options, 1))  # fmt: skip
    with pytest.raises(ShapeError, match=r"input \[2, 4, 8, 9\] float32, prepared for \[2, 4, 9, 9\]"):
        numba_conv.run(launch, x0[:, :, 1:])
    with pytest.raises(ShapeError, match="prepared for"):
        numba_conv.run(launch, x0.astype(np.float64))
    if channels >= numba_conv.OB:
        with_relu = numba_conv.prepare(x0, w, b, options, 1, ((0.0, None), (None, None)))
        residual = rng.standard_normal((2, channels, 9, 9)).astype(np.float32)
        want = numba_conv.conv2d(x0, w, b, options, 1, epilogue=numba_conv.Epilogue(
            (0.0, None), residual))  # fmt: skip
        np.testing.assert_array_equal(numba_conv.run(with_relu, x0, np.empty, residual), want)
        with pytest.raises(ShapeError, match="residual"):
            numba_conv.run(with_relu, x0, np.empty, residual[:, :, 1:])
    else:
        with pytest.raises(UnsupportedError, match="epilogue needs"):
            numba_conv.prepare(x0, w, b, options, 1, ((0.0, None), (None, None)))


def test_a_launch_is_kept_for_weights_nothing_can_change(no_packed_weights):
    rng = np.random.default_rng(12)
    options = ConvOptions((1, 1), (1, 1), (1, 1), 1)
    x = rng.standard_normal((2, 4, 9, 9)).astype(np.float32)
    w = rng.standard_normal((16, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float64)  # another dtype: the launch holds a copy
    want = reference(x, w, b, (1, 1), (1, 1), (1, 1), 1)
    for _ in range(2):  # writable: prepared on every call, nothing kept
        np.testing.assert_allclose(numba_conv.conv2d(x, w, b, options, 1), want, rtol=1e-5,
                                   atol=1e-5)  # fmt: skip
    assert not numba_conv._packed
    b += 1.0  # in place: a kept copy of the bias would be stale
    np.testing.assert_allclose(numba_conv.conv2d(x, w, b, options, 1), want + 1, rtol=1e-5,
                               atol=1e-5)  # fmt: skip
    w.flags.writeable = b.flags.writeable = False
    for _ in range(2):
        np.testing.assert_allclose(numba_conv.conv2d(x, w, b, options, 1), want + 1, rtol=1e-5,
                                   atol=1e-5)  # fmt: skip
    assert len(numba_conv._packed[id(w)][2]) == 1
    loose = b.copy()  # a writable bias beside a read-only weight: prepared every call
    np.testing.assert_allclose(numba_conv.conv2d(x, w, loose, options, 1), want + 1, rtol=1e-5,
                               atol=1e-5)  # fmt: skip
    loose += 1.0
    np.testing.assert_allclose(numba_conv.conv2d(x, w, loose, options, 1), want + 2, rtol=1e-5,
                               atol=1e-5)  # fmt: skip
    assert len(numba_conv._packed[id(w)][2]) == 1
    weight_ref = numba_conv._packed[id(w)][0]
    other = w.copy()
    other.flags.writeable = False
    del w
    assert weight_ref() is None  # held weakly: the kept launch does not keep the weight alive
    assert not numba_conv._packed and numba_conv._packed_bytes == 0  # nor its blocks
    np.testing.assert_allclose(numba_conv.conv2d(x, other, b, options, 1), want + 1, rtol=1e-5,
                               atol=1e-5)  # fmt: skip


def test_kept_launches_are_bounded_by_their_weight_blocks(monkeypatch, no_packed_weights):
    rng = np.random.default_rng(13)
    options = ConvOptions((1, 1), (1, 1), (1, 1), 1)
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    weights = []
    for _ in range(4):
        w = rng.standard_normal((16, 4, 3, 3)).astype(np.float32)
        w.flags.writeable = False
        weights.append(w)
    one = numba_conv.prepare(x, weights[0], None, options, 1).before[0].nbytes
    monkeypatch.setattr(numba_conv, "PACKED_CACHE_BYTES", 2 * one)
    for w in weights:
        numba_conv.conv2d(x, w, None, options, 1)
        assert len(numba_conv._packed) <= 2 and numba_conv._packed_bytes <= 2 * one
        assert len(numba_conv._packed[id(w)][2]) == 1  # its launch kept beside its blocks
