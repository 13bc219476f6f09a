"""The collectives' buffer pool: memory is reused only when nothing refers to it."""

from __future__ import annotations

import numpy as np

from ember.distributed.buffers import BufferPool

BIG = 1 << 20


def test_a_buffer_is_reused_once_unreferenced():
    pool = BufferPool()
    first = pool.take(BIG)
    address = first.ctypes.data
    del first
    again = pool.take(BIG)
    assert again.ctypes.data == address


def test_a_live_view_keeps_the_buffer_lent():
    pool = BufferPool()
    view = pool.take(BIG)[:BIG].view(np.float32).reshape(512, 512)
    view[:] = 7.0
    other = pool.take(BIG)
    assert other.ctypes.data != view.ctypes.data
    other[:] = 0  # writing the second buffer leaves the first one's values
    assert (view == 7.0).all()


def test_a_torch_tensor_sharing_the_buffer_keeps_it_lent():
    import pytest

    torch = pytest.importorskip("torch")
    pool = BufferPool()
    tensor = torch.from_numpy(pool.take(BIG).view(np.float32))
    tensor.fill_(3.0)
    assert pool.take(BIG).ctypes.data != tensor.data_ptr()
    assert bool((tensor == 3.0).all())


def test_the_pool_keeps_at_most_max_bytes():
    pool = BufferPool(max_bytes=2 * BIG)
    held = [pool.take(BIG) for _ in range(3)]  # the third is not kept
    assert pool._bytes == 2 * BIG
    del held
    bigger = pool.take(2 * BIG)  # room is made by dropping idle buffers of other sizes
    assert pool._bytes == 2 * BIG and bigger.nbytes == 2 * BIG


def test_small_requests_are_not_pooled():
    pool = BufferPool()
    assert pool.take(100).nbytes == 100
    assert pool._bytes == 0
