"""``views.compose``: reshape and permute chains as one strided view, against NumPy's own
chains of the same steps (which copy where a step has no view); ``views.strided``, the
views it and the kernels' flat operands are made by."""

from __future__ import annotations

import numpy as np
import pytest

from ember.backend.kept import owner
from ember.backends.fusion.views import _interface_offset, byte_offset, compose, strided


def _random_chain(rng: np.random.Generator, x: np.ndarray) -> tuple[list, np.ndarray, bool]:
    """Random steps on ``x``: the chain, NumPy's result, and whether NumPy made every step a
    view of ``x``."""
    chain, want, views = [], x, True
    for _ in range(rng.integers(1, 4)):
        if rng.random() < 0.5:
            axes = tuple(int(a) for a in rng.permutation(want.ndim))
            chain.append(("permute", axes))
            want = want.transpose(axes)
        else:
            dims, rest = [], want.size
            for factor in (2, 3, 2):
                if rest % factor == 0 and rng.random() < 0.5:
                    dims.append(factor)
                    rest //= factor
            dims.append(rest)
            rng.shuffle(dims)
            chain.append(("reshape", tuple(int(d) for d in dims)))
            want = np.reshape(want, chain[-1][1])
        views = views and np.shares_memory(want, x)
    return chain, want, views


@pytest.mark.parametrize("seed", range(4))
def test_compose_equals_numpys_chain_and_copies_nothing(seed):
    rng = np.random.default_rng(seed)
    composed = 0
    for _ in range(400):
        rank = int(rng.integers(1, 5))
        shape = tuple(int(s) for s in rng.choice([1, 2, 3, 4, 6], rank))
        x = np.arange(np.prod(shape) * 3, dtype=np.float32).reshape((*shape, 3))[..., 1]
        if rank > 1 and rng.random() < 0.5:
            x = x.transpose(rng.permutation(rank))
        chain, want, views = _random_chain(rng, x)
        got = compose(x, chain)
        if views:  # where NumPy needs no copy, neither does compose
            assert got is not None, chain
        if got is not None:
            composed += 1
            assert got.shape == want.shape and np.shares_memory(got, x)
            np.testing.assert_array_equal(got, want)
            assert not got.flags.writeable
    assert composed > 200  # most chains of these shapes compose


def test_an_imported_models_head_split_is_one_view():
    """The split NumPy copies (``[128, 8, 256]`` of a permuted buffer into ``[128, 32, 64]``)
    ends in a view once the chain is whole."""
    qkv = np.random.default_rng(0).standard_normal((8, 128, 768)).astype(np.float32)
    q = qkv.transpose(1, 0, 2)[:, :, :256]
    split = ("reshape", (128, 32, 64))
    with pytest.raises(ValueError):
        np.reshape(q, split[1], copy=False)
    chain = [split, ("permute", (1, 0, 2)), ("reshape", (8, 4, 128, 64))]
    got = compose(q, chain)
    assert got is not None and np.shares_memory(got, qkv)
    np.testing.assert_array_equal(got, np.reshape(q, (128, 32, 64)).transpose(1, 0, 2).reshape(8, 4, 128, 64))
    assert compose(q, chain[:1]) is None  # the split alone has no view


@pytest.mark.parametrize("chain", [[("permute", (0, 0))], [("reshape", (5,))], [("flip", (0,))]])
def test_compose_refuses_what_is_not_a_chain_of_this_array(chain):
    assert compose(np.zeros((2, 3), np.float32), chain) is None


def test_a_composed_view_of_pooled_memory_is_made_through_its_owner():
    """A pooled array views a raw byte buffer: the composed view's owner is that buffer, so
    views of it (a kernel's flat operand) are made the cheap way too."""
    raw = np.zeros(4096 + 8 * 128 * 768 * 4, np.uint8)
    qkv = np.ndarray((8, 128, 768), np.float32, raw, 4096)
    qkv[...] = np.random.default_rng(1).standard_normal(qkv.shape)
    chain = [("reshape", (8, 128, 3, 8, 32)), ("slice", ((0, 8, 1), (0, 128, 1), (1, 2, 1), (0, 8, 1), (0, 32, 1))),
             ("reshape", (8, 128, 8, 32)), ("permute", (0, 2, 1, 3))]  # fmt: skip
    got = compose(qkv, chain)
    want = qkv.reshape(8, 128, 3, 8, 32)[:, :, 1].transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(got, want)
    assert owner(got) is raw and not got.flags.writeable and qkv.flags.writeable


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


@pytest.mark.parametrize("case", ["pooled head view", "read-only view", "bytes", "as_strided",
                                  "past the end", "asked read-only", "offset",
                                  "as_strided offset"])  # fmt: skip
def test_a_strided_view_spans_its_memory_as_writeable_as_asked(case):
    """The view starts where asked, holds exactly the elements its strides name and is
    writeable exactly where the operand is (and was not asked otherwise), through the
    contiguous array that holds the memory or, where none does, NumPy's ``as_strided``."""
    raw = np.arange(1 << 16, dtype=np.uint8)
    if case == "bytes":
        operand = np.frombuffer(bytes(range(256)) * 16, np.float32).reshape(1, 4, 16, 16)
    elif case.startswith("as_strided"):  # its base is not an array: its own owner
        operand = np.lib.stride_tricks.as_strided(
            np.arange(512, dtype=np.float32), (1, 2, 8, 8), (0, 256, 32, 4))
    else:  # a pooled [batch, seq, 3 * heads * features] projection's value heads
        projection = np.ndarray((2, 8, 3 * 4 * 8), np.float32, raw, 64)
        operand = projection.reshape(2, 8, 3, 4, 8)[:, :, 2].transpose(0, 2, 1, 3)
        if case == "read-only view":
            operand = operand.view()
            operand.flags.writeable = False
    item = operand.itemsize
    span = 1 + sum((n - 1) * s // item for n, s in zip(operand.shape, operand.strides))
    skip = 3 if case.endswith("offset") else 0
    if case == "past the end":  # more than the owner holds: as_strided, unchecked
        span = raw.nbytes
    flat = strided(operand, (span - skip,), (item,), skip * item,
                   writeable=False if case == "asked read-only" else None)  # fmt: skip
    assert flat.shape == (span - skip,) and flat.dtype == operand.dtype
    assert _address(flat) == _address(operand) + skip * item
    assert flat.flags.writeable == (operand.flags.writeable and case != "asked read-only")
    if case != "past the end":
        lanes = np.array(operand.strides) // item
        for index in [(0, 0, 0, 0), (1, 1, 3, 5), (1, 3, 7, 7)]:
            index = tuple(min(i, n - 1) for i, n in zip(index, operand.shape))
            if int(np.dot(index, lanes)) >= skip:
                assert flat[int(np.dot(index, lanes)) - skip] == operand[index]


def test_the_byte_offset_is_numpys():
    """numba's reading of two addresses (``strided``'s fast path) agrees with NumPy's
    interface for views of every kind: read-only, transposed, of another dtype."""
    raw = np.zeros(1 << 14, np.uint8)
    projection = np.ndarray((4, 8, 48), np.float32, raw, 192)
    read_only = projection[1:, :, 8:].view()
    read_only.flags.writeable = False
    views = [projection, projection[:, 2:, 16:32].transpose(1, 0, 2), read_only,
             np.ndarray((100,), np.float64, raw, 4000), raw[7:]]  # fmt: skip
    for view in views:
        assert byte_offset(view, raw) == _interface_offset(view, raw) > 0
