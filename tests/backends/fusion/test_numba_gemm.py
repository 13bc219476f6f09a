"""The numba GEMM (``numba_gemm``) against NumPy in float64, and its op kernel entry through
a ``fusion(ndarray)`` device with the numba runtime."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import Tensor
from ember.backend.errors import UnsupportedError
from ember.backends.fusion import autotune, op_kernels, reset_stats, stats

gemm = pytest.importorskip("ember.backends.fusion.numba_gemm")
pytest.importorskip("numba")

DTYPES = [np.float32, np.float64]


def _check(a: np.ndarray, b: np.ndarray, threads: int = 1) -> None:
    got = gemm.matmul(a, b, threads=threads)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert got.dtype == a.dtype and got.shape == want.shape and got.flags.c_contiguous
    tol = 1e-5 if a.dtype == np.float32 else 1e-12
    scale = np.sqrt(a.shape[-1]) * max(1.0, np.abs(a).max() * np.abs(b).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * scale)


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_shapes_match_numpy(dtype):
    rng = np.random.default_rng(0)
    for _ in range(12):
        # Sizes around the tile (12 or 6 rows, 32 or 16 columns): edges, single rows, and as
        # few columns as it takes (a quarter tile).
        m, k = (int(rng.choice([1, 2, 3, 4, 5, 7, 33, 64, 65, 130])) for _ in range(2))
        n = int(rng.choice([gemm.NR[np.dtype(dtype)] // 4, 17, 33, 64, 65, 130]))
        a = rng.standard_normal((m, k)).astype(dtype)
        b = rng.standard_normal((k, n)).astype(dtype)
        _check(a, b, threads=int(rng.integers(1, 4)))


@pytest.fixture(params=["B packed whole", "B packed by blocks", "B whole, strips claimed"])
def b_blocks(request, monkeypatch):
    """Runs a test with the default budget for B's panels, with one small enough that its
    products pack B a block at a time (``_blocks``), and with products of few rows claiming
    strips as larger ones do rather than sharing B's panels (``_across_panels``)."""
    if request.param == "B packed by blocks":
        monkeypatch.setattr(gemm, "B_BLOCK_BYTES", 1 << 16)
    if request.param == "B whole, strips claimed":
        monkeypatch.setattr(gemm, "PANELS_MAX_ROWS", 0)
    return request.param


def test_read_only_and_writable_operands_share_one_compiled_kernel():
    # A step's inputs are read-only, activations writable: numba types them apart, and the
    # GEMM marks what it only reads so that both run one compile.
    import numba

    kernels = [f for f in vars(gemm).values()
               if isinstance(f, numba.core.registry.CPUDispatcher)]  # fmt: skip
    rng = np.random.default_rng(3)
    for shape_a, shape_b in [((40, 70), (70, 90)), ((300, 64), (64, 48))]:
        a, b = (rng.standard_normal(s).astype(np.float32) for s in (shape_a, shape_b))
        bias = rng.standard_normal(shape_b[1]).astype(np.float32)
        want = gemm.matmul(a, b, threads=1, bias=bias)
        compiled = sum(len(f.signatures) for f in kernels)
        # Read-only views of writable memory (memory nothing can change takes the path
        # that packs a constant B once)
        a_view, b_view, bias_view = (x.view() for x in (a, b, bias))
        for x in (a_view, b_view, bias_view):
            x.flags.writeable = False
        np.testing.assert_array_equal(gemm.matmul(a_view, b_view, threads=1, bias=bias_view), want)
        assert sum(len(f.signatures) for f in kernels) == compiled
        assert a.flags.writeable and b.flags.writeable  # the caller's arrays stay as they were


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transposed", [False, True], ids=["a by rows", "a by columns"])
def test_blocks_of_k_add_up_at_every_edge(dtype, transposed, b_blocks, monkeypatch):
    # K longer than a block (``_k_block``: the tiles add later blocks to their sums; strips
    # of 512 steps at most, whatever the host's vectors), rows and columns past whole tiles
    # of either geometry (the edge tiles add through their scratch tile), and ``A`` read by
    # columns where it is a transposed C-contiguous array (a weight's gradient).
    monkeypatch.setattr(gemm, "STRIP_BYTES", gemm.MR * np.dtype(dtype).itemsize * 512)
    rng = np.random.default_rng(4)
    m, k, n = 2 * max(gemm.MR, gemm.WIDE_MR) + 5, 1500, gemm.NR[np.dtype(dtype)] + 7
    assert gemm._k_block(k, n, np.dtype(dtype).itemsize) < k
    for batch in ((), (3,)):
        a = rng.standard_normal((*batch, k, m) if transposed else (*batch, m, k)).astype(dtype)
        a = a.swapaxes(-1, -2) if transposed else a
        assert gemm._batched_a(a, m, k)[1] == transposed
        _check(a, rng.standard_normal((k, n)).astype(dtype), threads=2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_and_strided_inputs(dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((70, 90)).astype(dtype)
    y = rng.standard_normal((90, 40)).astype(dtype)
    _check(x.T[:33], x[:, 3:70])  # transposed lhs [33, 70] @ a column slice [70, 67]
    _check(x[::2, ::3], y[::3, ::2][:30])  # steps in both dims of both
    _check(x[:40, :90], np.ascontiguousarray(y.T).T)  # a weight stored [N, K], used as [K, N]
    batched = rng.standard_normal((3, 20, 50)).astype(dtype)
    _check(batched, batched.swapaxes(1, 2))  # q @ k^T, as attention does
    readonly = x[:40].copy()
    readonly.flags.writeable = False  # as Tensor.from_data may hold it
    _check(readonly, y)
    assert np.shares_memory(gemm._batched_a(readonly, 40, 90)[0], readonly)  # read in place
    _check(y.T, readonly.T[:, :17])
    raw = np.zeros(40 * 90 * np.dtype(dtype).itemsize + 1, np.uint8)
    unaligned = raw[1:].view(dtype).reshape(40, 90)  # a C-contiguous array off alignment
    unaligned[...] = x[:40]
    assert not unaligned.flags.aligned
    _check(unaligned, y)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_dims_broadcast_like_numpy(dtype):
    rng = np.random.default_rng(2)
    cases = [((2, 1, 5, 7), (3, 7, 19)), ((5, 7), (4, 7, 33)), ((4, 5, 7), (7, 16)),
             ((1, 6, 65), (2, 65, 66)), ((2, 3, 1, 4), (2, 3, 4, 70))]  # fmt: skip
    for sa, sb in cases:
        _check(rng.standard_normal(sa).astype(dtype), rng.standard_normal(sb).astype(dtype), 2)


@pytest.mark.parametrize(("m", "k", "n"), [(150, 70, 200), (150, 1300, 200), (300, 1300, 90)],
                         ids=["one block", "blocks by panels", "blocks by strips"])  # fmt: skip
def test_parts_split_the_tasks_without_changing_a_bit(m, k, n, b_blocks):
    # Several blocks of K run in the kernel that packs B a block at a time, its parts taking
    # a share of the panels (n >= m) or of the strips (n < m).
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    one = gemm.matmul(a, b, threads=1)
    _check(a, b)
    for threads in (2, 3, 7):
        np.testing.assert_array_equal(gemm.matmul(a, b, threads=threads), one)


def test_parts_that_claim_strips_take_each_once_in_any_order(monkeypatch):
    # Where B is packed whole, the tile kernel runs a call a thread, each taking slices of
    # CLAIM_STRIPS strips from a counter they share: run one after another, last call
    # first, the last claims every slice but the others' own, and the output has the bits
    # of one thread's.
    from ember.backends.fusion import numba_runtime

    rng = np.random.default_rng(4)
    a = rng.standard_normal((2, 150, 70)).astype(np.float32)
    b = rng.standard_normal((70, 200)).astype(np.float32)
    one = gemm.matmul(a, b, threads=1)
    launches = []

    def in_reverse(kernel, args, parts, threads=None, calls=None):
        launches.append((kernel, args))
        for part in reversed(range(min(calls or parts, parts))):  # the runtime makes `calls` calls
            kernel(*args, part, parts)

    monkeypatch.setattr(numba_runtime, "_run_parts", in_reverse)
    for threads in (2, 5):
        launches.clear()
        np.testing.assert_array_equal(gemm.matmul(a, b, threads=threads), one)
        claims = next(args[-1] for kernel, args in launches if kernel is gemm._tiles)
        mr = gemm.WIDE_MR if gemm.WIDE else gemm.MR
        tasks = 2 * -(-150 // mr)
        # the counter: its start (a call a thread) and a claim per slice, found or empty
        assert claims[1] == max(threads, -(-tasks // gemm.CLAIM_STRIPS)) + threads


def test_a_block_of_k_keeps_one_parts_panels_in_l2():
    # A part that packs half of B's columns takes blocks of K twice as long; where all of B
    # fits, K is cut only where a strip would outgrow STRIP_BYTES.
    full = gemm._k_block(4096, 1024, 4)
    assert full * 1024 * 4 == gemm.B_BLOCK_BYTES
    assert gemm._k_block(4096, 512, 4) == 2 * full
    assert gemm._k_block(1024, 256, 4) == 1024
    assert gemm._k_block(4096, 64, 4) == gemm.STRIP_BYTES // (gemm.MR * 4)


@pytest.mark.parametrize("n", [40, 900], ids=["parts by strips", "parts by panels"])
def test_a_transposed_a_packed_by_groups_of_strips(n, monkeypatch):
    # A weight gradient's dYᵀ: more strips than one group (``STRIP_GROUP``), so each block
    # of K packs several groups; parts that split the strips start inside a group.
    monkeypatch.setattr(gemm, "B_BLOCK_BYTES", 1 << 16)  # B packed a block at a time
    rng = np.random.default_rng(7)
    m, k = 2 * gemm.STRIP_GROUP * gemm.MR + 5, 1300
    a = rng.standard_normal((k, m)).astype(np.float32).T
    b = rng.standard_normal((k, n)).astype(np.float32)
    assert gemm._batched_a(a, m, k)[1] and gemm._k_block(k, n, 4) < k
    one = gemm.matmul(a, b, threads=1)
    _check(a, b, threads=1)
    for threads in (2, 3):
        np.testing.assert_array_equal(gemm.matmul(a, b, threads=threads), one)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_bias_starts_every_sum_on_every_path(dtype, b_blocks):
    # Whole B and B by blocks (parts by panels and by strips), edge tiles, a transposed A,
    # a stack, a kept constant B and several thread counts: each output is a @ b + bias.
    rng = np.random.default_rng(8)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for m, k, n, transposed in [(29, 1500, 45, False), (150, 1300, 200, True),
                                (300, 700, 39, False), (5, 7, 33, False)]:  # fmt: skip
        a = rng.standard_normal((k, m) if transposed else (m, k)).astype(dtype)
        a = a.T if transposed else a
        b = rng.standard_normal((k, n)).astype(dtype)
        bias = rng.standard_normal(n).astype(dtype)
        want = a.astype(np.float64) @ b.astype(np.float64) + bias
        scale = np.sqrt(k) * max(1.0, np.abs(a).max() * np.abs(b).max())
        for threads in (1, 2, 3):
            got = gemm.matmul(a, b, threads=threads, bias=bias)
            np.testing.assert_allclose(got, want, rtol=0, atol=tol * scale)
        frozen = b.copy()
        frozen.flags.writeable = False  # kept panels
        got = gemm.matmul(a, frozen, threads=2, bias=bias)
        np.testing.assert_allclose(got, want, rtol=0, atol=tol * scale)
    stack = rng.standard_normal((3, 20, 50)).astype(dtype)
    b = rng.standard_normal((50, 40)).astype(dtype)
    bias = rng.standard_normal(40).astype(dtype)
    np.testing.assert_allclose(gemm.matmul(stack, b, threads=2, bias=bias),
                               stack.astype(np.float64) @ b + bias, rtol=0, atol=1e-4)  # fmt: skip


def test_a_product_added_into_an_array_in_place(b_blocks):
    # The sums start from the array's values, on every path; the array itself is returned.
    rng = np.random.default_rng(16)
    for m, k, n, transposed in [(29, 1500, 45, False), (150, 1300, 200, True), (300, 700, 39, False)]:
        a = rng.standard_normal((k, m) if transposed else (m, k)).astype(np.float32)
        a = a.T if transposed else a
        b = rng.standard_normal((k, n)).astype(np.float32)
        start = rng.standard_normal((m, n)).astype(np.float32)
        want = start + a.astype(np.float64) @ b
        for threads in (1, 2):
            into = start.copy()
            assert gemm.matmul(a, b, threads=threads, into=into) is into
            np.testing.assert_allclose(into, want, rtol=0, atol=1e-5 * np.sqrt(k) * 16)


def test_an_array_the_product_cannot_be_added_into_is_refused():
    a = np.ones((40, 30), np.float32)
    b = np.ones((30, 40), np.float32)
    square = np.ones((40, 40), np.float32)
    for into, bias in ((np.ones((40, 41), np.float32), None), (np.ones((40, 40)), None),
                       (square.T.copy().T[:, ::-1], None), (square, np.ones(40, np.float32)),
                       (a[:, :30].copy(), None)):  # fmt: skip
        with pytest.raises(gemm.KernelUnsupported, match="numba matmul"):
            gemm.matmul(a, b, into=into, bias=bias)
    both = np.ones((40, 40), np.float32)
    with pytest.raises(gemm.KernelUnsupported, match="add"):
        gemm.matmul(both, both, into=both)  # it reads the array it would write


def test_a_bias_of_another_length_or_dtype_is_refused():
    a = np.ones((4, 3), np.float32)
    b = np.ones((3, 40), np.float32)
    for bias in (np.ones(39, np.float32), np.ones(40, np.float64), np.ones((1, 40), np.float32)):
        with pytest.raises(gemm.KernelUnsupported, match="bias"):
            gemm.matmul(a, b, bias=bias)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [48, 700], ids=["one block", "blocks"])
def test_transposed_rows_of_b_pack_by_whole_vectors(dtype, k, b_blocks):
    # B as a transposed C-contiguous array (a weight's Wᵀ, attention's kᵀ), batched and not,
    # with whole panels (transposed in registers) and an edge panel, K past whole vectors.
    rng = np.random.default_rng(6)
    n = 2 * gemm.NR[np.dtype(dtype)] + 5
    keys = rng.standard_normal((2, n, k + 3)).astype(dtype)
    queries = rng.standard_normal((2, 40, k + 3)).astype(dtype)
    _check(queries, keys.swapaxes(1, 2), threads=2)
    weight = rng.standard_normal((n, k)).astype(dtype)
    weight.flags.writeable = False  # as an imported model's
    _check(rng.standard_normal((29, k)).astype(dtype), weight.T)


def test_inputs_are_not_written_and_output_comes_from_empty():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((9, 10)).astype(np.float32)
    b = rng.standard_normal((10, 21)).astype(np.float32)
    a0, b0 = a.copy(), b.copy()
    made = []

    def empty(shape, dtype):
        made.append(np.full(shape, np.nan, dtype))
        return made[-1]

    out = gemm.matmul(a, b, threads=1, empty=empty)
    assert out is made[0]
    # Every element written (9 rows: the last tile holds one; 21 columns: a third of one).
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)


def test_supports_refuses_what_ndarray_must_run():
    a = np.ones((3, 4), np.float32)
    b = np.ones((4, 16), np.float32)
    quarter = {t: gemm.NR[np.dtype(t)] // 4 for t in (np.float32, np.float64)}
    assert gemm.supports(a, b) and gemm.supports(a.astype(np.float64), b.astype(np.float64))
    refused = [
        (a.astype(np.float16), b.astype(np.float16)),  # low precision: NdArray's f32 path
        (a.astype(np.int64), b.astype(np.int64)),
        (a, b.astype(np.float64)),  # mixed dtypes
        (a, np.ones((5, 16), np.float32)),  # inner dims differ
        (np.ones((0, 4), np.float32), b),  # empty
        (np.ones((2, 3, 4), np.float32), np.ones((3, 4, 5), np.float32)),  # batch 2 vs 3
        (np.ones(4, np.float32), b),  # rank 1
        # under a quarter tile (of the host's vector width)
        (np.ones((3, 4), np.float32), np.ones((4, quarter[np.float32] - 1), np.float32)),
        (np.ones((3, 4)), np.ones((4, quarter[np.float64] - 1))),
    ]
    for x, y in refused:
        assert not gemm.supports(x, y)
        with pytest.raises(UnsupportedError):
            gemm.matmul(x, y)


def test_op_kernel_entry_names_work_and_key():
    kernel = op_kernels.NDARRAY_KERNELS["float_matmul"]
    a = np.ones((2, 3, 5, 7), np.float32)
    b = np.ones((7, 20), np.float32)
    assert kernel.supports([a, b])
    assert not kernel.supports([a.astype(np.int32), b.astype(np.int32)])
    assert kernel.work([a, b]) == 2 * 3 * 5 * 20 * 7
    assert kernel.key([a, b]) != kernel.key([a, np.ones((20, 7), np.float32).T])
    np.testing.assert_array_equal(kernel.run([a, b], 1), np.matmul(a, b))


@pytest.mark.parametrize("pooled", [False, True], ids=["fresh output", "pooled output"])
def test_a_stack_of_rows_times_a_matrix_is_one_product_laid_out_as_its_rows(pooled):
    # A C-contiguous stack, and one whose rows are contiguous in another order of its dims
    # (an imported model's [seq, batch, dim]), run as one product of all their rows; the
    # permuted one's output is laid out in that order (a view, as NdArray's matmul gives).
    from ember.backends.fusion.buffers import BufferPool

    kernel = op_kernels.NDARRAY_KERNELS["float_matmul"]
    empty = BufferPool().take if pooled else np.empty
    rng = np.random.default_rng(9)
    b = rng.standard_normal((40, 70)).astype(np.float32)
    stacked = rng.standard_normal((3, 29, 40)).astype(np.float32)
    permuted = rng.standard_normal((5, 29, 40)).astype(np.float32).transpose(1, 0, 2)
    for a in (stacked, permuted):
        got = kernel.run([a, b], 2, empty)
        want = np.matmul(a.astype(np.float64), b.astype(np.float64))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
        assert got.shape == want.shape
    assert kernel.run([permuted, b], 1, empty).transpose(1, 0, 2).flags.c_contiguous


@pytest.mark.parametrize("threads", [2, 3])
def test_stacks_run_as_blas_shares_over_threads(threads):
    """Above one thread a stack of products runs as NumPy's BLAS on each thread's share of
    the first batch dim, the BLAS held to one thread meanwhile (restored after)."""
    from ember.backends.ndarray import parallel

    kernel = op_kernels.NDARRAY_KERNELS["float_matmul"]
    rng = np.random.default_rng(11)
    a = rng.standard_normal((5, 3, 17, 9)).astype(np.float32)
    heads = rng.standard_normal((5, 17, 3, 9)).astype(np.float32)
    b = heads.transpose(0, 2, 3, 1)  # a head-split view, read where it lies: [5, 3, 9, 17]
    before = parallel.blas_threads()
    taken = []

    def empty(shape, dtype):
        taken.append((shape, np.dtype(dtype)))
        return np.full(shape, np.nan, dtype)  # every element must be written

    got = kernel.run([a, b], threads, empty)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert taken == [((5, 3, 17, 17), np.dtype(np.float32))]
    assert parallel.blas_threads() == before
    one = np.ones((1, 3, 4, 64), np.float32)  # a stack of one: the numba GEMM's parts
    square = np.ones((1, 3, 64, 64), np.float32)
    np.testing.assert_array_equal(kernel.run([one, square], threads), np.full((1, 3, 4, 64), 64.0))
    # The two run different candidates above one thread, so they are tuned apart.
    assert kernel.key([one, square]) != kernel.key([np.ones((2, 3, 4, 64), np.float32),
                                                    np.ones((2, 3, 64, 64), np.float32)])  # fmt: skip


def _encoder_products(device, x, w, q, k):
    """A linear layer's product and attention's scores, as ember's Linear and
    MultiHeadAttention compute them (``x @ w``, ``q @ k^T``)."""
    xt = Tensor.from_data(x, device)
    wt = Tensor.from_data(w, device)
    scores = Tensor.from_data(q, device).matmul(Tensor.from_data(k, device).swap_dims(2, 3))
    return [xt.matmul(wt).to_numpy(), scores.to_numpy()]


def test_fusion_device_runs_the_numba_matmul():
    rng = np.random.default_rng(5)
    # Large enough to be tuned (autotune: at least numba_runtime.PARALLEL_MIN multiply-adds).
    x = rng.standard_normal((130, 96)).astype(np.float32)
    w = rng.standard_normal((96, 70)).astype(np.float32)
    q = rng.standard_normal((2, 3, 40, 16)).astype(np.float32)
    k = rng.standard_normal((2, 3, 40, 16)).astype(np.float32)
    want = _encoder_products(ember.device("ndarray"), x, w, q, k)
    fused = ember.device("ndarray").fusion(runtime="numba")
    reset_stats()
    with autotune.forcing(autotune.Choice("fused", 1)):
        got = _encoder_products(fused, x, w, q, k)
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5 * np.abs(e).max())
    assert stats()["op_kernels"] == 2


def test_a_permuted_stack_times_a_weight_then_a_bias_on_a_fusion_device():
    # The product of a [seq, batch, dim] view comes out of the pool laid out as its rows
    # (a transposed view); the bias added at its last use must not take it for an output
    # to write over (the numba runtime writes C-contiguous outputs only).
    rng = np.random.default_rng(10)
    x = rng.standard_normal((6, 40, 96)).astype(np.float32)
    w = rng.standard_normal((96, 70)).astype(np.float32)
    bias = rng.standard_normal(70).astype(np.float32)

    def forward(device):
        seq_first = Tensor.from_data(x, device).permute([1, 0, 2])
        # [1, 1, N]: a bias the GEMM's own (BiasedMatmulFuser, [N] only) leaves to the add.
        y = seq_first.matmul(Tensor.from_data(w, device)) + Tensor.from_data(bias[None, None], device)
        return (y * 2.0).to_numpy()

    want = forward(ember.device("ndarray"))
    fused = ember.device("ndarray").fusion(runtime="numba")
    reset_stats()
    with autotune.forcing(autotune.Choice("fused", 2)):
        got = forward(fused)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert stats()["op_kernels"] == 1


def _linear(x, w, bias, device, after=lambda y: y * 2.0):
    """``after(x @ w + bias)`` on ``device`` (a linear layer and what follows it)."""
    y = Tensor.from_data(x, device).matmul(Tensor.from_data(w, device)) + Tensor.from_data(bias, device)
    return after(y)


@pytest.mark.parametrize("permuted", [False, True], ids=["[batch, seq, dim]", "[seq, batch, dim]"])
def test_a_linear_layers_bias_starts_the_gemms_sums_on_a_fusion_device(permuted):
    # BiasedMatmulFuser takes the product and the addition of its [N] bias: one op kernel
    # and no element-wise kernel for the addition (the small scaling after it runs alone).
    rng = np.random.default_rng(12)
    x = rng.standard_normal((40, 6, 96) if permuted else (6, 40, 96)).astype(np.float32)
    x = x.transpose(1, 0, 2) if permuted else x
    w = rng.standard_normal((96, 70)).astype(np.float32)
    bias = rng.standard_normal(70).astype(np.float32)
    want = (x.astype(np.float64) @ w + bias) * 2.0
    fused = ember.device("ndarray").fusion(runtime="numba")
    for threads in (1, 2):
        reset_stats()
        with autotune.forcing(autotune.Choice("fused", threads)):
            got = _linear(x, w, bias, fused).to_numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        counts = stats()
        assert counts["op_kernels"] == 1 and counts["fused_ops"] == 2, counts
        assert counts["kernels"] == 0 and counts["unfused_ops"] == 1, counts
    reset_stats()
    with autotune.forcing(autotune.UNFUSED):  # the tuner's other choice: the two records
        got = _linear(x, w, bias, fused).to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert stats()["op_kernels"] == 0


def test_a_product_read_after_its_bias_runs_record_by_record():
    # The product itself is read later too: the kernel would not write it, so the records run.
    rng = np.random.default_rng(13)
    x = rng.standard_normal((130, 96)).astype(np.float32)
    w = rng.standard_normal((96, 70)).astype(np.float32)
    bias = rng.standard_normal(70).astype(np.float32)
    device = ember.device("ndarray").fusion(runtime="numba")
    reset_stats()
    with autotune.forcing(autotune.Choice("fused", 1)):
        product = Tensor.from_data(x, device).matmul(Tensor.from_data(w, device))
        biased = product + Tensor.from_data(bias, device)
        got = [biased.to_numpy(), product.to_numpy()]
    np.testing.assert_allclose(got[1], x @ w, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got[0], x @ w + bias, rtol=1e-5, atol=1e-4)
    assert stats()["op_kernels"] == 1  # the product alone


def test_only_a_bias_of_the_products_columns_joins_the_gemm():
    # A residual [M, N], a bias [1, N] or of another dtype stay with the element-wise ops.
    rng = np.random.default_rng(14)
    x = rng.standard_normal((130, 96)).astype(np.float32)
    w = rng.standard_normal((96, 70)).astype(np.float32)
    device = ember.device("ndarray").fusion(runtime="numba")
    for other in (rng.standard_normal((130, 70)), rng.standard_normal((1, 70))):
        other = other.astype(np.float32)
        reset_stats()
        with autotune.forcing(autotune.Choice("fused", 1)):
            got = _linear(x, w, other, device, after=lambda y: y).to_numpy()
        np.testing.assert_allclose(got, x @ w + other, rtol=1e-5, atol=1e-4)
        assert stats()["fused_ops"] == 0, other.shape


def test_a_replayed_linear_layer_launches_its_biased_product_directly():
    from ember.backends.fusion import replay

    rng = np.random.default_rng(15)
    w = rng.standard_normal((96, 70)).astype(np.float32)
    bias = rng.standard_normal(70).astype(np.float32)
    device = ember.device("ndarray").fusion(runtime="numba")
    weight, b = Tensor.from_data(w, device), Tensor.from_data(bias, device)
    g = replay(lambda x: ((x.matmul(weight) + b) * 0.1).tanh())
    with autotune.forcing(autotune.Choice("fused", 2)):
        for call in range(5):
            x = rng.standard_normal((130, 96)).astype(np.float32)
            reset_stats()
            got = g(Tensor.from_data(x, device)).to_numpy()
            want = np.tanh((x.astype(np.float64) @ w + bias) * 0.1)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
            counts = stats()
            assert counts["direct_replays"] == (call >= 3) and counts["op_kernels"] == 1, counts


def test_panels_of_a_constant_b_are_packed_once_per_view_and_dropped_with_it():
    # An imported model's weight is read-only down to its memory: its panels are kept, one
    # entry per view of it (W and Wᵀ), and go when the weight does.
    import gc

    gemm._kept.entries.clear()
    rng = np.random.default_rng(7)
    weight = rng.standard_normal((70, 90)).astype(np.float32)
    weight.flags.writeable = False
    x = rng.standard_normal((33, 70)).astype(np.float32)
    y = rng.standard_normal((33, 90)).astype(np.float32)
    for _ in range(2):
        _check(x, weight)
        _check(y, weight.T)  # a new view object each call, the same entry
    assert len(gemm._kept.entries) == 2
    _check(x, rng.standard_normal((70, 90)).astype(np.float32))  # writable: packed per call
    assert len(gemm._kept.entries) == 2
    del weight
    gc.collect()
    other = rng.standard_normal((70, 90)).astype(np.float32)
    other.flags.writeable = False
    _check(x, other)  # the next call drops the dead weight's entries
    assert len(gemm._kept.entries) == 1


def test_a_kept_b_is_read_as_it_is_now_not_as_a_writable_owner_was():
    # A read-only view of a writable array can change under it: never kept.
    rng = np.random.default_rng(8)
    weight = rng.standard_normal((40, 50)).astype(np.float32)
    view = weight.view()
    view.flags.writeable = False
    x = rng.standard_normal((20, 40)).astype(np.float32)
    _check(x, view)
    weight *= 2
    _check(x, view)


def test_a_product_left_to_numpy_runs_on_one_blas_thread_beside_the_workers(monkeypatch):
    # With workers of its own, the runtime holds NumPy's BLAS to one thread for a product it
    # leaves to NumPy (OpenBLAS's threads spin long after each product, on the cores the
    # workers need), and the tuner weighs that against the kernel on its threads.
    from ember.backends.fusion import numba_runtime
    from ember.backends.ndarray import parallel
    from ember.backends.ndarray.backend import NdArray

    if not parallel._blas():
        pytest.skip("no OpenBLAS with a thread pool of its own is loaded")
    seen = []
    inner = NdArray.float_matmul

    def spy(self, a, b):
        seen.append(parallel.blas_threads())
        return inner(self, a, b)

    monkeypatch.setattr(NdArray, "float_matmul", spy)
    monkeypatch.setattr(numba_runtime.NumbaRuntime, "thread_count", lambda self: 2)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((130, 96)).astype(np.float32)
    w = rng.standard_normal((96, 70)).astype(np.float32)
    before = [(c, c.num_threads) for c in parallel._blas()]
    try:
        for c, _ in before:
            c.set_num_threads(2)
        assert parallel.blas_threads() == 2
        for threads_now, fused in ((1, True), (2, False)):  # a plain NdArray device keeps 2
            device = ember.device("ndarray").fusion(runtime="numba") if fused else ember.device("ndarray")
            with autotune.forcing(autotune.UNFUSED):
                got = (Tensor.from_data(x, device) @ Tensor.from_data(w, device)).to_numpy()
            np.testing.assert_allclose(got, x @ w, rtol=1e-5, atol=1e-4)
            assert seen.pop() == threads_now
        assert parallel.blas_threads() == 2  # restored after the product
        # A product no BLAS splits (under BLAS_THREADED_MIN multiply-adds) runs as it is.
        small_x, small_w = x[:8, :64], w[:64, :10]
        device = ember.device("ndarray").fusion(runtime="numba")
        with autotune.forcing(autotune.UNFUSED):
            got = (Tensor.from_data(small_x, device) @ Tensor.from_data(small_w, device)).to_numpy()
        np.testing.assert_allclose(got, small_x @ small_w, rtol=1e-5, atol=1e-4)
        assert seen.pop() == 2
    finally:
        for c, count in before:
            c.set_num_threads(count)


def _residual_sum(x, a, w, device, keep_residual=False):
    """``x * 2 + a @ w``: a residual made before a product it then takes (an input
    gradient's sum of its paths)."""
    residual = Tensor.from_data(x, device) * 2.0
    total = residual + Tensor.from_data(a, device).matmul(Tensor.from_data(w, device))
    return (total, residual) if keep_residual else total


def _residual_data(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((512, 512)).astype(np.float32)  # a lone kernel's output: pooled
    a = rng.standard_normal((512, 96)).astype(np.float32)
    w = rng.standard_normal((96, 512)).astype(np.float32)
    return x, a, w, x.astype(np.float64) * 2 + a.astype(np.float64) @ w


def test_a_product_added_to_a_value_at_its_last_use_adds_into_its_array():
    x, a, w, want = _residual_data(17)
    device = ember.device("ndarray").fusion(runtime="numba")
    with autotune.forcing(autotune.Choice("fused", 2)):
        reset_stats()
        got = _residual_sum(x, a, w, device).to_numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        counts = stats()  # one kernel (the scaling), the sum made by the product's
        assert counts["kernels"] == 1 and counts["fused_ops"] == 3, counts
        assert counts["in_place"] == 1 and counts["op_kernels"] == 1, counts
        # The residual is read after the sum too: the two records run (the addition's
        # kernel writes over the product instead).
        reset_stats()
        total, residual = _residual_sum(x, a, w, device, keep_residual=True)
        np.testing.assert_allclose(total.to_numpy(), want, rtol=1e-5, atol=1e-4)
        np.testing.assert_array_equal(residual.to_numpy(), x * 2)
        assert stats()["kernels"] == 2
    reset_stats()
    with autotune.forcing(autotune.UNFUSED):  # the product is NumPy's: nothing to add into
        np.testing.assert_allclose(_residual_sum(x, a, w, device).to_numpy(), want, rtol=1e-5,
                                   atol=1e-4)  # fmt: skip
    assert stats()["op_kernels"] == 0 and stats()["in_place"] == 0


@pytest.mark.parametrize("made_by", ["a lone kernel", "a block"])
def test_a_replayed_sum_of_a_residual_and_a_product_adds_in_place_directly(made_by):
    # The residual comes from a lone kernel (its slot recycles its array) or from a block
    # of a direct replay (the pool takes the buffer back when its last view dies).
    from ember.backends.fusion import replay

    device = ember.device("ndarray").fusion(runtime="numba")
    w = _residual_data(18)[2]
    weight = Tensor.from_data(w, device)
    block = made_by == "a block"
    g = replay(lambda x, a: ((x * 2.0).abs() if block else x * 2.0) + a.matmul(weight))
    with autotune.forcing(autotune.Choice("fused", 2)):
        for call in range(5):
            x, a, _, want = _residual_data(19 + call)
            want = (np.abs(x) if block else x).astype(np.float64) * 2 + a.astype(np.float64) @ w
            reset_stats()
            got = g(Tensor.from_data(x, device), Tensor.from_data(a, device)).to_numpy()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
            counts = stats()
            assert counts["direct_replays"] == (call >= 3), counts
            assert counts["in_place"] == 1 and counts["kernels"] == 1, counts


def test_a_residual_that_is_a_view_of_a_held_value_is_not_written_over():
    # The addend is a reshape (a view) of a value the caller holds: writing the sum into
    # its memory would change the held value.
    x, a, w, _ = _residual_data(20)
    device = ember.device("ndarray").fusion(runtime="numba")

    def terms():  # the view is no caller's; the value it views is
        held = Tensor.from_data(x, device) * 2.0
        flat = held.reshape([512 * 512]).reshape([512, 512])
        return held, flat + Tensor.from_data(a, device).matmul(Tensor.from_data(w, device))

    with autotune.forcing(autotune.Choice("fused", 2)):
        held, total = terms()
        got, kept = total.to_numpy(), held.to_numpy()
    np.testing.assert_array_equal(kept, x * 2)
    np.testing.assert_allclose(got, x.astype(np.float64) * 2 + a.astype(np.float64) @ w,
                               rtol=1e-5, atol=1e-4)  # fmt: skip


def test_a_sum_of_terms_adds_each_into_a_residual_whose_views_are_done():
    # The residual's reshape is read before the products (a weight gradient's reshape of
    # dY); its slot still views the buffer, read by nothing more: both terms add in place.
    x, a, w, _ = _residual_data(21)
    rng = np.random.default_rng(22)
    a2 = rng.standard_normal((512, 64)).astype(np.float32)
    w2 = rng.standard_normal((64, 512)).astype(np.float32)
    device = ember.device("ndarray").fusion(runtime="numba")
    reset_stats()

    def terms():  # the residual is no caller's: it goes when this returns
        residual = Tensor.from_data(x, device) * 2.0
        side = residual.reshape([1024, 256]).matmul(Tensor.from_data(w2[:, :256].T, device))
        total = residual + Tensor.from_data(a, device).matmul(Tensor.from_data(w, device))
        return total + Tensor.from_data(a2, device).matmul(Tensor.from_data(w2, device)), side

    with autotune.forcing(autotune.Choice("fused", 2)):
        total, side = terms()
        got, beside = total.to_numpy(), side.to_numpy()
    want = x.astype(np.float64) * 2 + a.astype(np.float64) @ w + a2.astype(np.float64) @ w2
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    x2 = (x.astype(np.float64) * 2).reshape(1024, 256)
    np.testing.assert_allclose(beside, x2 @ w2[:, :256].T, rtol=1e-5, atol=1e-4)
    counts = stats()
    assert counts["op_kernels"] == 3 and counts["kernels"] == 1, counts  # no kernel adds them


def test_a_residual_with_a_view_the_caller_holds_is_not_written_over():
    # The residual itself is no caller's, but a view of it is: its buffer must stay as is.
    x, a, w, _ = _residual_data(23)
    device = ember.device("ndarray").fusion(runtime="numba")

    def terms():
        residual = Tensor.from_data(x, device) * 2.0
        view = residual.reshape([512 * 512])  # before the product, as a dead view would be
        return view, residual + Tensor.from_data(a, device).matmul(Tensor.from_data(w, device))

    with autotune.forcing(autotune.Choice("fused", 2)):
        view, total = terms()
        got, seen = total.to_numpy(), view.to_numpy()
    np.testing.assert_array_equal(seen, (x * 2).reshape(-1))
    np.testing.assert_allclose(got, x.astype(np.float64) * 2 + a.astype(np.float64) @ w,
                               rtol=1e-5, atol=1e-4)  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transposed", [False, True], ids=["a by rows", "a by columns"])
def test_a_b_packed_once_multiplies_any_rows_like_numpy(dtype, transposed):
    # Row counts around both tiles a packed product picks from (12 rows, or 8 with AVX-512
    # where that runs fewer: 16, 40, 64), as few columns as a product takes, a K of one.
    rng = np.random.default_rng(7)
    nr = gemm.NR[np.dtype(dtype)]
    for m in (1, 5, 8, 12, 13, 16, 24, 40, 64):
        for k, n in ((1, nr // 4), (7, 33), (256, 3 * nr + 5)):
            b = rng.standard_normal((k, n)).astype(dtype)
            a = rng.standard_normal((k, m) if transposed else (m, k)).astype(dtype)
            a = a.T if transposed else a
            packed = gemm.pack_b(b)
            outs = []
            for threads in (1, 2, 3):
                out = np.full((m, n), np.nan, dtype)
                assert gemm.matmul_packed(a, packed, out, threads=threads) is out
                outs.append(out)
            want = a.astype(np.float64) @ b.astype(np.float64)
            tol = (1e-5 if dtype == np.float32 else 1e-12) * np.sqrt(k) * np.abs(want).max()
            np.testing.assert_allclose(outs[0], want, rtol=0, atol=tol, err_msg=f"{m}x{k}x{n}")
            # Each output is one part's sums in one order, at any thread count.
            assert all(np.array_equal(outs[0], o) for o in outs[1:]), (m, k, n)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_stack_of_packed_bs_multiplies_each_entry_by_its_own(dtype):
    # A recurrent layer's directions: one packed stack, each entry of a by its own B, the
    # (entry, panel) pairs shared between the threads; the bits of one thread.
    rng = np.random.default_rng(12)
    for entries, m, k, n in [(2, 16, 128, 512), (3, 5, 40, 70), (2, 1, 7, 33)]:
        b = rng.standard_normal((entries, k, n)).astype(dtype)
        a = rng.standard_normal((entries, m, k)).astype(dtype)
        packed = gemm.pack_b(b)
        want = a.astype(np.float64) @ b.astype(np.float64)
        outs = []
        for threads in (1, 2, 3):
            out = np.full((entries, m, n), np.nan, dtype)
            assert gemm.matmul_packed(a, packed, out, threads=threads) is out
            outs.append(out)
        tol = (1e-5 if dtype == np.float32 else 1e-12) * np.sqrt(k) * np.abs(want).max()
        np.testing.assert_allclose(outs[0], want, rtol=0, atol=tol)
        assert all(np.array_equal(outs[0], o) for o in outs[1:])
        # each entry transposed in memory (a step's state read as [E, K, M])
        at = np.ascontiguousarray(a.swapaxes(1, 2)).swapaxes(1, 2)
        np.testing.assert_array_equal(gemm.matmul_packed(at, packed, outs[1], threads=2), outs[0])
        with pytest.raises(gemm.KernelUnsupported, match=f"packed {entries}x{k}x{n}"):
            gemm.matmul_packed(a[0], packed, outs[1][0])  # one entry for a stack of them


def test_a_packed_b_is_a_copy_and_a_non_contiguous_a_is_read_as_it_is():
    rng = np.random.default_rng(8)
    b = rng.standard_normal((64, 96)).astype(np.float32)
    want_b = b.copy()
    packed = gemm.pack_b(b[:, ::1])
    b[...] = 0  # the panels hold their own copy
    a = rng.standard_normal((20, 128)).astype(np.float32)[:, ::2]  # strided columns
    out = np.empty((20, 96), np.float32)
    gemm.matmul_packed(a, packed, out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ want_b, rtol=0, atol=1e-4)
    transposed_b = np.asfortranarray(want_b)  # packed by whole vectors of its rows
    gemm.matmul_packed(a, gemm.pack_b(transposed_b), out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ want_b, rtol=0, atol=1e-4)


def test_what_a_packed_product_cannot_take_is_refused_by_name():
    b = np.ones((8, 64), np.float32)
    for bad, says in ((np.ones(64, np.float32), "(64,)"), (np.ones((8, 64), np.int32), "int32"),
                      (np.ones((8, 3), np.float32), "(8, 3)"), ([[1.0]], "list")):  # fmt: skip
        with pytest.raises(gemm.KernelUnsupported, match=says.replace("(", r"\(").replace(")", r"\)")):
            gemm.pack_b(bad)
    packed = gemm.pack_b(b)
    a, out = np.ones((4, 8), np.float32), np.empty((4, 64), np.float32)
    for args in ((np.ones((4, 9), np.float32), packed, out),  # K differs
                 (a.astype(np.float64), packed, out),  # dtype differs
                 (a, packed, np.empty((4, 63), np.float32)),  # output shape
                 (a, packed, np.empty((64, 4), np.float32).T),  # output not C-contiguous
                 (np.empty((0, 8), np.float32), packed, np.empty((0, 64), np.float32))):  # fmt: skip
        with pytest.raises(gemm.KernelUnsupported, match="packed 1x8x64"):
            gemm.matmul_packed(*args)
    shared = np.zeros(4 * 8 + 4 * 64, np.float32)
    with pytest.raises(gemm.KernelUnsupported, match="packed 1x8x64"):  # out overlaps a
        gemm.matmul_packed(shared[:32].reshape(4, 8), packed, shared[16:272].reshape(4, 64))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transposed", [False, True], ids=["a by rows", "a by columns"])
def test_few_rows_share_bs_panels_across_threads_with_a_bias_or_adding(dtype, transposed):
    # Products of at most PANELS_MAX_ROWS rows whose B fits in L2 split B's panels between
    # the threads: a bias and an array added into start the sums there too, edge tiles and
    # rows the narrow tile takes (16, 40) included, and the bits are those of one thread.
    rng = np.random.default_rng(11)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for m, k, n in [(16, 256, 1024), (40, 300, 70), (5, 7, 33), (gemm.PANELS_MAX_ROWS, 64, 40)]:
        a = rng.standard_normal((k, m) if transposed else (m, k)).astype(dtype)
        a = a.T if transposed else a
        b = rng.standard_normal((k, n)).astype(dtype)
        bias = rng.standard_normal(n).astype(dtype)
        start = rng.standard_normal((m, n)).astype(dtype)
        product = a.astype(np.float64) @ b.astype(np.float64)
        scale = tol * np.sqrt(k) * max(1.0, np.abs(a).max() * np.abs(b).max())
        one = gemm.matmul(a, b, threads=1, bias=bias)
        np.testing.assert_allclose(one, product + bias, rtol=0, atol=scale)
        for threads in (2, 3):
            np.testing.assert_array_equal(gemm.matmul(a, b, threads=threads, bias=bias), one)
            into = start.copy()
            assert gemm.matmul(a, b, threads=threads, into=into) is into
            np.testing.assert_allclose(into, start + product, rtol=0, atol=scale * 4)
