"""The record tree: how a record's values become the plain values every format stores.

A record is a tree of ``dict`` (str keys), ``list`` (tuples are saved as lists),
``str``, ``int``, ``float``, ``bool``, ``None``, ``bytes`` and
:class:`~ember.TensorData`. Every ember format (see :mod:`ember.record.formats`)
stores the same tree, by the same rules:

- a dict is a map, a list an array, ``str`` / ``bool`` / ``None`` themselves;
- an ``int`` is an integer in ``[-2**63, 2**64)`` (the range MessagePack holds);
- a ``float`` is a 64-bit float;
- a map key that begins with ``$`` is stored with one ``$`` more (``"$x"`` is
  saved as ``"$$x"``), so that keys beginning with a single ``$`` are free to
  mark typed leaves;
- a *typed leaf* is a map with exactly one key, its *tag*, whose value is the
  payload: ``{"$tensor": ...}`` is a tensor (payload defined by each format),
  ``{"$bytes": "<base64>"}`` a byte string and ``{"$float": "nan" | "inf" |
  "-inf"}`` a float that is not finite. MessagePack stores bytes and every
  float natively, so only JSON files use the last two.

Maps and lists nest at most :data:`~ember.record.limits.MAX_DEPTH` levels deep,
both ways: ember refuses to save a deeper record, so that it reads whatever it writes.

Errors name the *record path* of the value concerned: map keys and list indices
joined with dots, as in ``encoder.layers.0.weight.param``.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable
from typing import Any

from ember.backend.errors import RecordError, RecordFormatError
from ember.record.limits import MAX_DEPTH, SizeError, describe, tensor_nbytes
from ember.record.precision import PrecisionSettings
from ember.tensor import DType, TensorData

TENSOR = "$tensor"
BYTES = "$bytes"
FLOAT = "$float"
TAGS = (TENSOR, BYTES, FLOAT)

_INT_MIN, _INT_END = -(2**63), 2**64
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_DTYPES = {dtype.value: dtype for dtype in DType}


def join(path: str, key: str | int) -> str:
    """The record path of ``key`` inside the value at ``path``."""
    return f"{path}.{key}" if path else str(key)


def format_error(source: str | None, what: str, path: str | None = None) -> RecordFormatError:
    """A :class:`RecordFormatError` that names the file (or byte string) and the record path."""
    where = f" at record path {path}" if path else ""
    return RecordFormatError(f"{source or 'record bytes'}: {what}{where}", path=path or None,
                             file=source)


class Leaves:
    """How one format stores the leaves the tree rules leave to it.

    A subclass gives the tensor payload both ways; bytes and floats are stored
    natively unless it overrides :meth:`encode_bytes` / :meth:`encode_float`.
    One instance serves one encode or one decode, so it may collect state
    (the Bin format gathers tensor buffers) and knows the ``source`` to name in errors.
    """

    def __init__(self, source: str | None = None) -> None:
        self.source = source

    def encode_tensor(self, data: TensorData, path: str) -> Any:
        """The payload stored under ``$tensor`` for ``data``."""
        raise NotImplementedError

    def decode_tensor(self, payload: Any, path: str) -> TensorData:
        """The tensor a ``$tensor`` payload describes; RecordFormatError when it is malformed."""
        raise NotImplementedError

    def encode_bytes(self, value: bytes) -> Any:
        return value

    def encode_float(self, value: float) -> Any:
        return value

    def error(self, what: str, path: str | None = None) -> RecordFormatError:
        return format_error(self.source, what, path)

    def tensor_fields(
        self, payload: Any, fields: tuple[str, ...], path: str
    ) -> tuple[DType, tuple[int, ...], int, list[Any]]:
        """Checks a tensor payload has exactly ``dtype``, ``shape`` and ``fields``, a known
        dtype and a shape some tensor can have (see :func:`~ember.record.limits.tensor_nbytes`).

        Returns:
            the dtype, the shape, the tensor's byte count and the values of ``fields`` in
            order.
        """
        expected = ("dtype", "shape", *fields)
        if not isinstance(payload, dict) or set(payload) != set(expected):
            got = sorted(payload) if isinstance(payload, dict) else type(payload).__name__
            raise self.error(f"a tensor must have the fields {list(expected)}, found {got}", path)
        dtype = _DTYPES.get(payload["dtype"]) if isinstance(payload["dtype"], str) else None
        if dtype is None:
            raise self.error(f"unknown dtype {describe(payload['dtype'])} (known: "
                             f"{', '.join(_DTYPES)})", path)
        shape = payload["shape"]
        try:
            nbytes = tensor_nbytes(shape, dtype.itemsize)
        except SizeError as exc:
            raise self.error(f"bad tensor shape: {exc}", path) from None
        return dtype, tuple(shape), nbytes, [payload[f] for f in fields]


def tag(name: str, payload: Any) -> dict[str, Any]:
    return {name: payload}


def encode_tree(record: Any, precision: PrecisionSettings, leaves: Leaves) -> Any:
    """``record`` as plain values, with tensors at ``precision`` and leaves encoded by ``leaves``.

    Raises:
        RecordError: a value of an unsupported type, a dict key that is not a str, an int
            outside ``[-2**63, 2**64)``, a str that is not valid Unicode, a record that
            contains itself or nests deeper than ``MAX_DEPTH``, or an Int tensor out of the
            precision's range; the message names the record path.
    """
    active: set[int] = set()  # containers on the current branch, to catch cycles

    def walk(value: Any, path: str, depth: int = 0) -> Any:
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, str):
            _check_text(value, path)
            return value
        if isinstance(value, int):
            if not _INT_MIN <= value < _INT_END:
                raise RecordError(f"{_where(path)}: int {value} is outside the range a record "
                                  f"holds, [-2**63, 2**64)", path=path or None)
            return int(value)
        if isinstance(value, float):
            return leaves.encode_float(float(value))
        if isinstance(value, bytes | bytearray):
            return leaves.encode_bytes(bytes(value))
        if isinstance(value, TensorData):
            return tag(TENSOR, leaves.encode_tensor(precision.convert(value, path), path))
        if isinstance(value, dict | list | tuple):
            if id(value) in active:
                raise RecordError(f"{_where(path)}: the record contains itself", path=path or None)
            if depth >= MAX_DEPTH:
                raise RecordError(f"{_where(path)}: dicts and lists nested deeper than "
                                  f"{MAX_DEPTH} levels", path=path or None)
            active.add(id(value))
            try:
                if isinstance(value, dict):
                    return {_escape(key, path): walk(item, join(path, key), depth + 1)
                            for key, item in value.items()}
                return [walk(item, join(path, i), depth + 1) for i, item in enumerate(value)]
            finally:
                active.discard(id(value))
        kind = type(value)
        raise RecordError(
            f"{_where(path)}: cannot save a value of type {kind.__module__}.{kind.__qualname__}; "
            f"a record holds dicts with str keys, lists, str, int, float, bool, None, bytes and "
            f"TensorData (wrap arrays with TensorData)",
            path=path or None,
        )

    return walk(record, "")


def decode_tree(tree: Any, leaves: Leaves) -> Any:
    """The record a tree of plain values stores (the inverse of :func:`encode_tree`).

    A byte string may come as a memoryview of the buffer the record was read into (the
    formats' readers give those, so that tensors need no copy); outside a tensor it becomes
    ``bytes``.

    Raises:
        RecordFormatError: an unknown tag, a malformed payload, a non-str map key, nesting
            deeper than ``MAX_DEPTH`` or a value of a type no format stores; the message
            names the source and the record path.
    """

    def walk(value: Any, path: str, depth: int) -> Any:
        if isinstance(value, dict | list) and depth >= MAX_DEPTH:
            raise leaves.error(f"maps and arrays nested deeper than {MAX_DEPTH} levels", path)
        if isinstance(value, dict):
            if len(value) == 1:
                key, payload = next(iter(value.items()))
                if key in TAGS:
                    return _decode_tag(key, payload, path)
            record = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise leaves.error(f"a map key must be a str, found {describe(key)}", path)
                if key.startswith("$"):
                    if not key.startswith("$$"):
                        raise leaves.error(f"unknown tag {key!r} (known: {', '.join(TAGS)})", path)
                    key = key[1:]
                record[key] = walk(item, join(path, key), depth + 1)
            return record
        if isinstance(value, list):
            return [walk(item, join(path, i), depth + 1) for i, item in enumerate(value)]
        if value is None or isinstance(value, str | bool | int | float | bytes):
            return value
        if isinstance(value, memoryview):
            return bytes(value)
        raise leaves.error(f"unexpected value of type {type(value).__name__}", path)

    def _decode_tag(key: str, payload: Any, path: str) -> Any:
        if key == TENSOR:
            return leaves.decode_tensor(payload, path)
        if key == BYTES:
            return _decoded(payload, base64_decode, "base64 text", path)
        return _decoded(payload, _NON_FINITE.__getitem__, '"nan", "inf" or "-inf"', path)

    def _decoded(payload: Any, decode: Callable[[str], Any], expected: str, path: str) -> Any:
        if isinstance(payload, str):
            try:
                return decode(payload)
            except (KeyError, ValueError):
                pass
        raise leaves.error(f"expected {expected}, found {describe(payload)}", path)

    return walk(tree, "", 0)


def base64_decode(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError(str(exc)) from None


def non_finite_name(value: float) -> str | None:
    """``"nan"``, ``"inf"`` or ``"-inf"`` for a non-finite float, ``None`` for a finite one."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return None


def _escape(key: Any, path: str) -> str:
    if not isinstance(key, str):
        kind = type(key)
        raise RecordError(f"{_where(path)}: dict keys must be str, found {key!r} of type "
                          f"{kind.__module__}.{kind.__qualname__}", path=path or None)
    _check_text(key, path)
    return "$" + key if key.startswith("$") else key


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RecordError(f"{_where(path)}: str {text!r:.60} is not valid Unicode ({exc.reason})",
                          path=path or None) from None


def _where(path: str) -> str:
    return f"record path {path}" if path else "record"
