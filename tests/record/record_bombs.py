"""Gzip bombs in ember's record formats, and a subprocess that measures loading one.

Shared by tests/record/test_hostile_records.py (small limits) and
benchmarks/record_bombs.py (the full 4 GB bombs at the default limit).

A bomb is built without ever holding its content: one 1 MiB block of the fill pattern is
deflated once (level 9, a full flush after it, so that it depends on no earlier data) and
its compressed bytes repeated, between a deflated prefix and suffix, inside a gzip header
and a trailer with the right CRC-32 and size. 4 GB of zeros take 4.2 MB.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import msgpack

BLOCK = 1 << 20
_TOP = {"format": None, "version": 1, "ember_version": "0.1.0",
        "precision": {"name": "full", "float": "f32", "int": "i32"}}


def gzip_bomb(prefix: bytes, fill: bytes, nbytes: int, suffix: bytes = b"") -> bytes:
    """gzip data holding ``prefix``, ``nbytes`` of ``fill`` repeated, then ``suffix``."""
    block = (fill * (BLOCK // len(fill) + 1))[:BLOCK]
    count, rest = divmod(nbytes, BLOCK)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: header added below
    head = compressor.compress(prefix) + compressor.flush(zlib.Z_FULL_FLUSH)
    repeated = compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH)
    tail = compressor.compress(block[:rest] + suffix) + compressor.flush()
    crc = zlib.crc32(prefix)
    for _ in range(count):
        crc = zlib.crc32(block, crc)
    crc = zlib.crc32(block[:rest] + suffix, crc)
    size = len(prefix) + nbytes + len(suffix)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    body = head + repeated * count + tail
    return header + body + struct.pack("<II", crc, size & 0xFFFFFFFF)


def _top(name: str, record: object) -> dict:
    return {**_TOP, "format": name, "record": record}


def mpk_declared(nbytes: int) -> bytes:
    """A Named MessagePack record of one u8 tensor of ``nbytes`` zeros (< 4 GiB): what ember
    itself writes for an all-zero tensor, compressed at level 9 instead of 1."""
    tensor = {"dtype": "u8", "shape": [nbytes], "data": b""}
    prefix = msgpack.packb(_top("ember.named-mpk", {"w": {"$tensor": tensor}}))
    assert prefix.endswith(b"\xc4\x00")  # the empty bin, last: replaced by a bin 32 header
    return gzip_bomb(prefix[:-2] + struct.pack(">BI", 0xC6, nbytes), b"\0", nbytes)


def mpk_trailing(nbytes: int) -> bytes:
    """A small valid Named MessagePack record followed by ``nbytes`` zeros."""
    return gzip_bomb(msgpack.packb(_top("ember.named-mpk", {"n": 1})), b"\0", nbytes)


def _bin_file(index: dict, data_nbytes: int) -> bytes:
    packed = msgpack.packb(index)
    head = struct.pack("<8sQQ", b"EMBERBIN", len(packed), data_nbytes) + packed
    return head + bytes(-len(head) % 64)


def bin_declared(nbytes: int) -> bytes:
    """A Bin record of one u8 tensor of ``nbytes`` zeros."""
    tensor = {"dtype": "u8", "shape": [nbytes], "offset": 0, "nbytes": nbytes}
    return gzip_bomb(_bin_file(_top("ember.bin", {"w": {"$tensor": tensor}}), nbytes), b"\0",
                     nbytes)


def bin_trailing(nbytes: int) -> bytes:
    """A small valid Bin record followed by ``nbytes`` zeros."""
    return gzip_bomb(_bin_file(_top("ember.bin", {"n": 1}), 0), b"\0", nbytes)


def json_values(nbytes: int) -> bytes:
    """A JSON record of one u8 tensor whose values, ``0,0,...``, take ``nbytes``."""
    count = nbytes // 2
    tensor = {"dtype": "u8", "shape": [count + 1], "values": []}
    text = json.dumps(_top("ember.json", {"w": {"$tensor": tensor}}), separators=(",", ":"))
    prefix, suffix = text.split("[]")
    return gzip_bomb(prefix.encode() + b"[", b"0,", 2 * count, b"0]" + suffix.encode())


def json_spaces(nbytes: int) -> bytes:
    """A JSON record with ``nbytes`` spaces (which JSON allows) before its record."""
    text = json.dumps(_top("ember.json", "@"), separators=(",", ":"))
    prefix, suffix = text.split('"@"')
    return gzip_bomb(prefix.encode(), b" ", nbytes, b"{}" + suffix.encode())


def raw_zeros(nbytes: int) -> bytes:
    """``nbytes`` zeros, gzipped: no format at all."""
    return gzip_bomb(b"", b"\0", nbytes)


BOMBS = {
    "mpk.gz": [mpk_declared, mpk_trailing, raw_zeros],
    "bin.gz": [bin_declared, bin_trailing, raw_zeros],
    "json.gz": [json_values, json_spaces, raw_zeros],
}
RECORDERS = {"mpk.gz": "NamedMpkGzFileRecorder", "bin.gz": "BinGzFileRecorder",
             "json.gz": "JsonGzFileRecorder"}

def measure(path: Path, kind: str, max_bytes: int | None = None) -> dict:
    """Loads ``path`` with the recorder of ``kind`` in a fresh interpreter.

    Returns:
        ``error`` (the exception's type, or None), ``message``, ``seconds`` and
        ``peak_growth`` (bytes the peak resident set grew by during the load).
    """
    script = r"""
import json, resource, sys, time
from ember.record import recorder as recorders
recorder = getattr(recorders, sys.argv[2])(max_bytes=int(sys.argv[3]) if sys.argv[3] else None)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
try:
    recorder.load(sys.argv[1])
    error, message = None, ""
except Exception as exc:
    error, message = type(exc).__name__, str(exc)
seconds = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"error": error, "message": message, "seconds": seconds,
                  "peak_growth": (after - before) * 1024}))
"""
    limit = "" if max_bytes is None else str(max_bytes)
    done = subprocess.run([sys.executable, "-c", script, str(path), RECORDERS[kind], limit],
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])
