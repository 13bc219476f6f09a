"""``kept.immutable``: which arrays nothing can change, so that a kernel may keep a form
made of them (packed weights, prepared launches); a false yes would leave stale forms."""

from __future__ import annotations

import numpy as np
import pytest

from ember import TensorData
from ember.backend.kept import immutable, seal
from ember.record.precision import FullPrecision
from ember.record.recorder import BinFileRecorder, NamedMpkFileRecorder, NamedMpkGzFileRecorder


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def test_what_can_change_is_not_immutable():
    owner = np.arange(8, dtype=np.float32)
    assert not immutable(owner)
    assert not immutable(_read_only(owner[2:]))  # a read-only view of a writable array
    # a read-only memoryview over a writable array: the array can still be written
    assert not immutable(_read_only(np.frombuffer(memoryview(owner).toreadonly(), np.float32)))
    shared = bytearray(16)
    assert not immutable(_read_only(np.frombuffer(shared, np.uint8)))  # its bytearray can
    assert not immutable(np.frombuffer(memoryview(shared), np.uint8))


def test_what_cannot_change_is_immutable():
    assert immutable(_read_only(np.arange(8.0)))
    assert immutable(_read_only(_read_only(np.arange(8.0))[1:].reshape(7, 1)))
    assert immutable(np.frombuffer(b"\x00" * 16, np.float32))
    assert immutable(_read_only(np.frombuffer(memoryview(b"\x00" * 16), np.uint8)))


def test_views_of_a_sealed_buffer_are_immutable_and_others_are_not():
    private = bytearray(64)
    raw = np.frombuffer(private, np.uint8)[8:40]
    raw[:] = 7
    buffer = seal(raw)
    assert not buffer.flags.writeable
    with pytest.raises(ValueError):
        buffer[0] = 1
    weights = np.frombuffer(memoryview(buffer), np.float32).reshape(2, 4)
    assert immutable(weights) and immutable(buffer[4:])
    # the same bytes reached another way are not sealed
    assert not immutable(_read_only(np.frombuffer(private, np.uint8)))
    del buffer, raw, weights  # a sealed buffer is held weakly


@pytest.mark.parametrize("recorder_type", [NamedMpkFileRecorder, NamedMpkGzFileRecorder,
                                           BinFileRecorder])  # fmt: skip
def test_a_loaded_records_tensors_are_immutable(recorder_type, tmp_path):
    # Tensors loaded from a file view the loader's own buffer, some without a copy: a
    # kernel keeps their packed forms (an imported model's convolutions packed their
    # weights on every call where they viewed the file's bytes).
    rng = np.random.default_rng(0)
    record = {f"w{i}": TensorData(rng.standard_normal((64, 32, 3, 3)).astype(np.float32))
              for i in range(4)}  # fmt: skip
    recorder = recorder_type(FullPrecision)
    path = recorder.save(record, tmp_path / "weights")
    loaded = recorder.load(path)
    for name, data in loaded.items():
        array = data._array
        assert immutable(array), name
        np.testing.assert_array_equal(array, record[name]._array)
