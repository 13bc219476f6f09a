"""``views.compose``: reshape and permute chains as one strided view, against NumPy's own
chains of the same steps (which copy where a step has no view)."""

from __future__ import annotations

import numpy as np
import pytest

from ember.backends.fusion.views import compose


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
