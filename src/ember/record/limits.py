"""What a record file may make ember allocate: size checks, and the limit on inflated content.

A hostile file can declare anything: a tensor of ``10**10`` elements in a file of a few
bytes, a dimension that is negative, a float or a string, a product of dimensions beyond
64 bits, data nested a million levels deep, or a gzip stream that inflates a few megabytes
into gigabytes (a *gzip bomb*). Readers therefore check every size they read with exact
integer arithmetic (:func:`tensor_nbytes`) against the bytes actually present before they
allocate anything, and bound nesting by :data:`MAX_DEPTH`.

**The content limit of gzip records.** For a compressed record the bytes present are the
compressed ones, and deflate shrinks runs of zeros by up to 1032:1: a 4 MB file can hold
4 GB of zeros, which is both what a gzip bomb is and what an all-zero weight file looks
like. ember therefore inflates a gzip record only up to its *content limit*, which is, in
order of precedence:

1. the ``max_bytes`` argument of the recorder;
2. the environment variable ``EMBER_RECORD_MAX_BYTES`` (a number of bytes, e.g.
   ``EMBER_RECORD_MAX_BYTES=20_000_000_000``);
3. ``max(256 MiB, 256 x the compressed size)``.

Why these numbers: ember writes gzip at level 1, which never shrinks data by more than
about 229:1 (that is its ratio on all zeros), so a ratio of 256 lets every file ember
writes load, whatever its size and content. Deflate at its best levels reaches 1032:1:
such a file (a record recompressed with ``gzip -9``, or a bomb) loads up to the 256 MiB
floor, beyond which its limit has to be raised on purpose. A 4 GB bomb compressed at
level 9 (4.2 MB) is thus refused at ~1 GB at the latest; the Bin header and the
MessagePack structure declare their sizes up front, so ember refuses those bombs before
inflating them at all (see :mod:`ember.record.content`).

The same limit bounds the values decoded outside tensors, which cost Python objects
rather than bytes: at most ``limit // VALUE_COST`` of them. An explicit ``max_bytes`` (or
the environment variable) also applies to uncompressed files, whose size is otherwise
their own bound.
"""

from __future__ import annotations

import itertools
import os

from ember.backend.errors import ArgumentError

MAX_BYTES_VARIABLE = "EMBER_RECORD_MAX_BYTES"
GZIP_RATIO = 256
"""The inflated-to-compressed size ratio a gzip record may reach without a raised limit."""
GZIP_FLOOR = 256 << 20
"""The content limit of a small gzip record, whatever its ratio."""
VALUE_COST = 64
"""The bytes a decoded value outside a tensor is counted as (a Python object and its slot)."""
MAX_DEPTH = 100
"""The deepest nesting of maps and lists a record may have (modules nest a dozen levels)."""
MAX_RANK = 64
"""The most dimensions a tensor may have (NumPy's limit)."""
_MAX_NBYTES = (1 << 63) - 1  # what NumPy can index: an array's byte count is a signed 64-bit


class SizeError(ValueError):
    """A declared shape or size that no tensor can have; the message says why.

    Readers catch it and raise their typed error with the file and the key.
    """


def tensor_nbytes(shape: object, itemsize: int) -> int:
    """The bytes a tensor of ``shape`` (a list or tuple of dimensions) with ``itemsize``-byte
    elements takes, computed exactly.

    Raises:
        SizeError: ``shape`` is not a list or tuple of non-negative ints (bools, floats and
            strings are not dimensions), has more than :data:`MAX_RANK` dimensions, or
            describes an array NumPy could not even index (its non-zero dimensions multiply
            to more than 2**63 - 1 bytes, as ``[0, 2**62]`` does).

    Example:
        >>> tensor_nbytes([2, 3], 4)
        24
        >>> tensor_nbytes([2, -3], 4)
        Traceback (most recent call last):
        ...
        ember.record.limits.SizeError: shape [2, -3] has a negative dimension -3
    """
    if not isinstance(shape, list | tuple):
        raise SizeError(f"a shape must be a list of dimensions, got {_show(shape)}")
    if len(shape) > MAX_RANK:
        raise SizeError(f"shape has {len(shape)} dimensions, more than {MAX_RANK}")
    nbytes, indexable = itemsize, itemsize
    for dim in shape:
        if type(dim) is not int:
            raise SizeError(f"shape {_show(shape)} has a dimension {_show(dim)} that is not an int")
        if dim < 0:
            raise SizeError(f"shape {_show(shape)} has a negative dimension {dim}")
        nbytes *= dim
        indexable *= max(dim, 1)
        if indexable > _MAX_NBYTES:
            raise SizeError(f"shape {_show(shape)} describes more than 2**63 bytes")
    return nbytes


def content_limit(compressed_nbytes: int | None, max_bytes: int | None = None) -> int | None:
    """The most bytes a record's content may hold (see the module docstring).

    Args:
        compressed_nbytes: the size of a gzip record's compressed data; ``None`` for an
            uncompressed record.
        max_bytes: the recorder's explicit limit, if any.

    Returns:
        the limit in bytes, or ``None`` (no limit beyond the file's own size) for an
        uncompressed record without an explicit limit.

    Raises:
        ArgumentError: ``EMBER_RECORD_MAX_BYTES`` is set to something other than a positive
            number of bytes.

    Example:
        >>> content_limit(10 << 20)  # a 10 MiB gzip record may inflate to 2.5 GiB
        2684354560
        >>> content_limit(None) is None, content_limit(None, max_bytes=1000)
        (True, 1000)
    """
    if max_bytes is None:
        max_bytes = _from_environment()
    if max_bytes is not None:
        return max_bytes
    if compressed_nbytes is None:
        return None
    return max(GZIP_FLOOR, GZIP_RATIO * compressed_nbytes)


def check_max_bytes(max_bytes: object, owner: str) -> int | None:
    """``max_bytes`` as given to ``owner``, checked: ``None`` or a positive int.

    Raises:
        ArgumentError: anything else.
    """
    if max_bytes is None or (type(max_bytes) is int and max_bytes > 0):
        return max_bytes
    raise ArgumentError(f"{owner}: max_bytes must be a positive number of bytes or None, "
                        f"got {max_bytes!r}")


def raise_hint() -> str:
    """How to raise the content limit, for error messages."""
    return (f"if the file is trusted, raise the limit with the recorder's max_bytes argument "
            f"or the {MAX_BYTES_VARIABLE} environment variable")


def _from_environment() -> int | None:
    setting = os.environ.get(MAX_BYTES_VARIABLE)
    if setting is None or not setting.strip():
        return None
    try:
        value = int(setting)
    except ValueError:
        value = 0
    if value <= 0:
        raise ArgumentError(f"{MAX_BYTES_VARIABLE}={setting!r}: expected a positive number of "
                            f"bytes, such as 8_000_000_000")
    return value


def describe(value: object, width: int = 60) -> str:
    """A short ``repr`` of a value read from a file, for error messages.

    A hostile value may be a list of a million entries or a string of a gigabyte, so it is
    cut before it is printed, not after: a container shows its first items, each briefly.

    Example:
        >>> describe(list(range(10**6)))
        '[0, 1, 2, 3, 4, 5, 6, 7, ...] (1000000 items)'
        >>> describe({"dtype": "f32", "shape": [[1]]})
        "{'dtype': 'f32', 'shape': [list of 1]}"
    """
    if isinstance(value, list | tuple | dict):
        pairs = value.items() if isinstance(value, dict) else zip(itertools.repeat(None), value)
        shown = [_brief(item) if key is None else f"{_brief(key)}: {_brief(item)}"
                 for key, item in itertools.islice(pairs, _ITEMS_SHOWN)]
        if len(value) > _ITEMS_SHOWN:
            shown.append("...")
        opening, closing = {list: "[]", tuple: "()", dict: "{}"}.get(type(value), "[]")
        count = f" ({len(value)} items)" if len(value) > _ITEMS_SHOWN else ""
        return _cut(opening + ", ".join(shown) + closing, width) + count
    return _brief(value, width)


_ITEMS_SHOWN = 8


def _brief(value: object, width: int = 16) -> str:
    if isinstance(value, list | tuple | dict):
        return f"[{type(value).__name__} of {len(value)}]"
    if isinstance(value, memoryview):
        return repr(bytes(value)) if value.nbytes <= width else f"[{value.nbytes} bytes]"
    if isinstance(value, str | bytes | bytearray) and len(value) > width:
        return _cut(repr(value[:width]), width) + f" [{len(value)} long]"
    if isinstance(value, int) and value.bit_length() > 128:
        return f"[an int of {value.bit_length()} bits]"
    return _cut(repr(value), width)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _show(value: object) -> str:
    return describe(value, 80)
