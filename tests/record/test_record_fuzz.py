"""Fuzzing ember's record readers: every mutated file loads to well-formed tensors or fails
with an EmberError, never another exception.

Mutations of valid files of every format, seeded so that a failure reproduces:

- bytes: bit flips, insertions, deletions, truncations in every region of the file
  (header, index / tree, tensor bytes, gzip trailer), overwritten and repeated ranges;
- for gzip formats, the same on the inflated content, gzipped again (a byte flip of the
  compressed file mostly just fails the CRC);
- structure: the top map decoded with plain msgpack / json, one node replaced by a value of
  another type (huge, negative and float ints, strings, bytes, deep nesting, containers),
  a key dropped, added or escaped, then re-encoded (the Bin index with its data section).
"""

from __future__ import annotations

import contextlib
import json
import random
import struct
import zlib
from collections import Counter
from typing import Any

import msgpack
import numpy as np
import pytest

from ember import TensorData
from ember.backend.errors import EmberError
from ember.record.recorder import (
    BinFileRecorder,
    BinGzFileRecorder,
    JsonGzFileRecorder,
    NamedMpkFileRecorder,
    NamedMpkGzFileRecorder,
    PrettyJsonFileRecorder,
)

RECORDERS = [NamedMpkFileRecorder, NamedMpkGzFileRecorder, BinFileRecorder, BinGzFileRecorder,
             PrettyJsonFileRecorder, JsonGzFileRecorder]
CASES_PER_FORMAT = 1500
LIMIT = 1 << 22  # 4 MiB: a mutated size must not make a test allocate gigabytes


def _record() -> dict[str, Any]:
    rng = np.random.default_rng(3)
    return {
        "layers": [
            {"weight": {"id": "00ff00ff00ff00ff", "param": TensorData(rng.standard_normal((3, 4)),
                                                                       "f32")},
             "bias": {"id": "0123456789abcdef", "param": TensorData(np.zeros(4), "f32")}},
            {"weight": {"id": "aaaaaaaaaaaaaaaa", "param": TensorData(np.arange(6), "i64")}},
        ],
        "half": TensorData([1.5, -2.0, float("nan")], "f16"),
        "mask": TensorData([[True, False]], "bool"),
        "empty": TensorData(np.zeros((0, 3)), "f32"),
        "scalar": TensorData(np.float64(2.5)),
        "bytes": b"\x00\x01\xff",
        "$dollar": "kept",
        "numbers": [0, -1, 2**64 - 1, -(2**63), 1.25, float("inf"), None, True],
        "text": "h\u00e9llo",
    }


# ------------------------------------------------------------------ mutations
def _byte_mutation(data: bytes, rng: random.Random) -> bytes:
    data = bytearray(data)
    kind = rng.randrange(6)
    at = rng.randrange(len(data)) if data else 0
    if kind == 0:  # bit flips
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == 1:  # insertion
        data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))
    elif kind == 2:  # deletion
        del data[at:at + rng.randint(1, 9)]
    elif kind == 3:  # truncation
        del data[at:]
    elif kind == 4:  # overwritten range (often with 0xff: huge lengths)
        fill = rng.choice([0x00, 0xFF, 0x7F, None])
        for i in range(at, min(len(data), at + rng.randint(1, 16))):
            data[i] = rng.randrange(256) if fill is None else fill
    else:  # a repeated range
        end = min(len(data), at + rng.randint(1, 64))
        data[at:at] = data[at:end] * rng.randint(1, 4)
    return bytes(data)


_HOSTILE = [
    -1, -(2**63), 2**63, 2**64 - 1, 10**10, 10**400, 1.5, float("nan"), "", "x" * 300, "f32",
    "bool", b"\x00" * 3, None, True, False, [], {}, {"dtype": "f32"}, {"$tensor": None},
    {"$bytes": "@@"}, {"$float": "nope"}, {"$weird": 1},
]
# Shapes and sizes, for the fields of tensor payloads.
_SIZES = [
    0, 1, 3, 63, 64, 65, -1, -64, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 10**10, 1.5,
    "3", True, None, [3],
]
_SHAPES = [
    [], [0], [-1], [1.5], ["3"], [True], [None], [[1]], [10**10], [2**40, 2**40],
    [2**62, 2**62, 4], [0, 2**62], [0, 2**63], [0, 2**64 - 1], [2**31, 2**31, 2**31],
    [2**64 - 1], [1] * 65, [1] * 64, [3, 4], [4, 3], [12], [2, 2, 3], "3", 3, None, {"0": 3},
]


def _deep(depth: int, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def _nodes(tree: Any, path: tuple = ()) -> list[tuple]:
    found = [path]
    if isinstance(tree, dict):
        for key, item in tree.items():
            found += _nodes(item, (*path, key))
    elif isinstance(tree, list):
        for index, item in enumerate(tree):
            found += _nodes(item, (*path, index))
    return found


def _structural_mutation(top: Any, rng: random.Random) -> Any:
    paths = _nodes(top)[1:]
    tensor_paths = [p for p in paths if "$tensor" in p[:-1]]
    # Half the mutations aim at tensor payloads, where sizes are.
    path = rng.choice(tensor_paths if tensor_paths and rng.random() < 0.5 else paths)
    parent = top
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    kind = rng.randrange(6)
    if kind == 0 and "$tensor" in path[:-1]:
        parent[key] = rng.choice(_SHAPES if key == "shape" else _SIZES)
        if key == "shape" and isinstance(parent[key], list) and "nbytes" in parent:
            # A consistent lie: nbytes agrees with the shape, only the data does not.
            with contextlib.suppress(TypeError):
                parent["nbytes"] = int(np.prod(parent[key], dtype=object)) * 4
    elif kind <= 1:
        parent[key] = rng.choice(_HOSTILE + _SIZES + _SHAPES)
    elif kind == 2:
        parent[key] = _deep(rng.choice([50, 99, 100, 101, 150, 5000]), parent[key])
    elif kind == 3 and isinstance(parent, dict):
        del parent[key]
    elif kind == 3:
        parent.pop(key)
    elif isinstance(parent, dict):
        parent[rng.choice(["$x", "$$x", "extra", "$tensor", "$bytes"])] = rng.choice(_HOSTILE)
    else:
        parent.append(rng.choice(_HOSTILE))
    return top


# ------------------------------------------------------------------ per format
def _inner(recorder, data: bytes) -> bytes:
    return zlib.decompress(data, 31) if recorder.compressed else data


def _outer(recorder, content: bytes) -> bytes:
    return zlib.compress(content, 1, 31) if recorder.compressed else content


def _restructure(recorder, content: bytes, rng: random.Random) -> bytes:
    """``content`` with its top map decoded, mutated and encoded again."""
    if recorder.encoding.extension == "json":
        top = _structural_mutation(json.loads(content), rng)
        return json.dumps(top, allow_nan=True).encode()
    if recorder.encoding.extension == "mpk":
        top = _structural_mutation(msgpack.unpackb(content, raw=False), rng)
        return msgpack.packb(top)
    _, index_nbytes, data_nbytes = struct.unpack_from("<8sQQ", content)
    start = -(-(24 + index_nbytes) // 64) * 64
    top = _structural_mutation(msgpack.unpackb(content[24:24 + index_nbytes], raw=False), rng)
    index = msgpack.packb(top)
    head = struct.pack("<8sQQ", b"EMBERBIN", len(index), data_nbytes) + index
    return head + bytes(-(-len(head) // 64) * 64 - len(head)) + content[start:]


def _mutant(recorder, data: bytes, rng: random.Random) -> bytes:
    choice = rng.random()
    if choice < 0.4:
        return _byte_mutation(data, rng)
    content = _inner(recorder, data)
    if choice < 0.6:
        return _outer(recorder, _byte_mutation(content, rng))
    try:
        return _outer(recorder, _restructure(recorder, content, rng))
    except (ValueError, TypeError, OverflowError, RecursionError):  # unencodable: bytes flip
        return _outer(recorder, _byte_mutation(content, rng))


def _check_well_formed(value: Any) -> None:
    """A successful load holds only plain values and tensors whose bytes are all there."""
    if isinstance(value, TensorData):
        array = value.buffer()
        assert array.shape == value.shape and array.nbytes == array.size * array.itemsize
        assert array.size == int(np.prod(value.shape))
        array.tobytes()  # every byte readable
    elif isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, str)
            _check_well_formed(item)
    elif isinstance(value, list):
        for item in value:
            _check_well_formed(item)
    else:
        assert value is None or isinstance(value, str | bytes | bool | int | float), type(value)


def fuzz(recorder_type, cases: int, seed: int = 0) -> Counter:
    """Loads ``cases`` mutants of a valid file; counts outcomes, raw errors listed."""
    recorder = recorder_type(max_bytes=LIMIT)
    data = recorder_type().to_bytes(_record())
    rng = random.Random(f"{recorder_type.__name__}-{seed}")
    counts: Counter = Counter()
    raw: list[str] = []
    for case in range(cases):
        mutant = _mutant(recorder, data, rng)
        try:
            loaded = recorder.from_bytes(mutant, source=f"case-{case}")
        except EmberError:
            counts["typed errors"] += 1
            continue
        except Exception as exc:  # what the test looks for: anything but an EmberError
            counts["raw errors"] += 1
            raw.append(f"case {case}: {type(exc).__name__}: {exc!s:.200}")
            continue
        _check_well_formed(loaded)
        counts["loaded"] += 1
    counts["cases"] = cases
    counts.raw = raw  # type: ignore[attr-defined]
    return counts


@pytest.mark.filterwarnings("error")  # a warning (NumPy overflow...) counts as a raw error
@pytest.mark.parametrize("recorder_type", RECORDERS, ids=lambda r: r.__name__)
def test_every_mutant_loads_or_fails_with_an_ember_error(recorder_type):
    counts = fuzz(recorder_type, CASES_PER_FORMAT)
    assert counts.raw == [], "\n".join(counts.raw[:20])
    # The mutations reach past the first checks: some load, most fail, in many ways.
    assert counts["typed errors"] > CASES_PER_FORMAT // 2 and counts["loaded"] > 0


if __name__ == "__main__":
    total: Counter = Counter()
    for recorder_type in RECORDERS:
        result = fuzz(recorder_type, CASES_PER_FORMAT)
        print(recorder_type.__name__, dict(result), *result.raw[:10], sep="\n  ")
        total.update(result)
    print("total", dict(total))
