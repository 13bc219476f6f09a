"""A pickle reader that builds plain data and calls nothing but what its caller allows.

Python's unpickler trusts its input in ways a weight file must not be trusted
with, even with ``find_class`` restricted: a 10-byte pickle makes it touch
2 GiB (a memo index of 2**27: it fills a memo array that long), a bytes
length of 2**40 is allocated before the data is found missing, a tuple
nested a million deep crashes the interpreter (a segfault) when hashed as a
dict key, and ``BUILD`` sets any attribute on any object. This reader
interprets the opcodes itself:

* data opcodes build ints, floats, strings, bytes, ``None``, bools, tuples,
  lists, dicts and sets, reading every length against the bytes present;
* ``GLOBAL`` / ``STACK_GLOBAL`` go through the caller's ``find_global``, which
  returns a stand-in or raises :class:`UnsafePickleError`; ``REDUCE`` calls only
  callables that ``find_global`` returned; persistent ids go to ``persistent_load``;
* ``BUILD`` drops its state (nothing is ever set on an object), and the opcodes
  that construct arbitrary objects (``INST``, ``OBJ``, ``NEWOBJ``, extensions)
  are refused with :class:`UnsafePickleError`;
* the memo is a dict, so its size follows the number of memo opcodes, and
  tuples and frozensets (the hashable containers) nest at most ``nesting`` deep.

Memory is therefore a small multiple of the pickle's size, and every failure
is a :class:`RecordFormatError` naming the file, the opcode and its position.
"""

from __future__ import annotations

import pickletools
import struct
from collections.abc import Callable
from typing import Any

from ember.backend.errors import EmberError, RecordFormatError, UnsafePickleError
from ember.record.limits import describe

_NAMES = {op.code.encode("latin-1")[0]: op.name for op in pickletools.opcodes}
_OBJECT_BUILDERS = {b"i"[0], b"o"[0], 0x81, 0x82, 0x83, 0x84, 0x92}  # INST OBJ NEWOBJ EXT NEWOBJ_EX
_HASHABLE_CONTAINERS = (tuple, frozenset)
_RAW_ERRORS = (IndexError, KeyError, TypeError, ValueError, OverflowError, RecursionError,
               struct.error, MemoryError)  # fmt: skip


class PickleReader:
    """Reads consecutive pickles from ``data`` into plain data.

    Args:
        data: the bytes holding the pickles (a whole file may follow them), not copied.
        source: the file, for messages.
        find_global: ``(module, name) -> stand-in``; raises for names it refuses.
        persistent_load: ``pid -> object`` for persistent ids (torch's storages).
        nesting: the deepest tuples and frozensets may nest.
    """

    def __init__(
        self,
        data: bytes | memoryview,
        source: str,
        find_global: Callable[[str, str], Any],
        persistent_load: Callable[[Any], Any],
        nesting: int = 64,
    ) -> None:
        self.data, self.source, self.position = memoryview(data).cast("B"), source, 0
        self.find_global, self.persistent_load, self.nesting = find_global, persistent_load, nesting

    # ------------------------------------------------------------------ driving
    def load(self) -> Any:
        """The next pickle's object; ``position`` moves past its ``STOP``."""
        self.stack: list[Any] = []
        self.marks: list[list[Any]] = []
        self.memo: dict[int, Any] = {}
        self.callables: dict[int, Any] = {}  # id -> what find_global returned that may be called
        self.depths: dict[int, int] = {}  # id -> nesting of each tuple and frozenset built
        self.built: list[Any] = []  # keeps those alive, so their ids stay theirs
        data, handlers, end = self.data, _HANDLERS, len(self.data)
        code = start = 0
        try:
            while True:
                if self.position >= end:
                    raise self._error(start, "the pickle ends before its STOP opcode")
                start = self.position
                code = data[start]
                self.position = start + 1
                if code == 0x2E:  # STOP
                    return self.stack.pop()
                handler = handlers.get(code)
                if handler is None:
                    raise self._refused(code, start)
                handler(self)
        except EmberError:
            raise
        except _RAW_ERRORS as exc:
            what = _NAMES.get(code, f"0x{code:02x}")
            raise self._error(start, f"opcode {what} fails: {type(exc).__name__}: "
                                     f"{str(exc)[:200]}") from None  # fmt: skip
        finally:  # the reader keeps nothing it built
            self.stack, self.marks, self.memo, self.built = [], [], {}, []
            self.callables, self.depths = {}, {}

    def _error(self, position: int, message: str) -> RecordFormatError:
        return RecordFormatError(f"{self.source}: pickle byte {position}: {message}",
                                 file=self.source)  # fmt: skip

    def _refused(self, code: int, position: int) -> RecordFormatError:
        if code in _OBJECT_BUILDERS:
            return UnsafePickleError(
                f"{self.source}: pickle byte {position}: refused opcode {_NAMES[code]}, which "
                "builds arbitrary objects (a weight file holds tensors and plain containers only)",
                file=self.source,
            )
        what = _NAMES.get(code, f"0x{code:02x}")
        return self._error(position, f"opcode {what} is not supported in a weight file")

    # ------------------------------------------------------------------ reading
    def _take(self, n: int) -> bytes:
        start = self.position
        if n < 0 or start + n > len(self.data):
            raise self._error(start, f"{n} bytes declared, {len(self.data) - start} left")
        self.position = start + n
        return bytes(self.data[start : start + n])

    def _uint(self, size: int) -> int:
        return int.from_bytes(self._take(size), "little")

    def _line(self) -> bytes:
        start, window = self.position, 64
        while True:  # windows growing fourfold: linear in the line's length
            text = bytes(self.data[start : start + window])
            newline = text.find(b"\n")
            if newline >= 0:
                self.position = start + newline + 1
                return text[:newline]
            if start + window >= len(self.data):
                raise self._error(start, "a text argument without its newline")
            window *= 4

    def _pop_mark(self) -> list[Any]:
        items = self.stack
        self.stack = self.marks.pop()
        return items

    def _text(self, raw: bytes) -> str:
        return raw.decode("utf-8", "surrogatepass")

    def _hashable(self, value: Any, items: Any) -> Any:
        """Records how deep ``value`` (a new tuple or frozenset of ``items``) nests."""
        depths = self.depths  # only those deeper than 1 are recorded
        nested = (depths.get(id(item), 1) for item in items if type(item) in _HASHABLE_CONTAINERS)
        depth = 1 + max(nested, default=0)
        if depth > self.nesting:
            raise self._error(self.position - 1, f"tuples nest deeper than {self.nesting}")
        if depth > 1:
            depths[id(value)] = depth
            self.built.append(value)
        return value

    def _tuple(self, items: Any) -> tuple:
        value = tuple(items)
        return self._hashable(value, value) if value else value

    # ------------------------------------------------------------------ opcodes
    def _proto(self) -> None:
        version = self._uint(1)
        if version > 5:
            raise self._error(self.position - 2, f"pickle protocol {version} is newer than 5")

    def _mark(self) -> None:
        self.marks.append(self.stack)
        self.stack = []

    def _pop(self) -> None:
        if self.stack:
            self.stack.pop()
        else:
            self._pop_mark()

    def _dup(self) -> None:
        self.stack.append(self.stack[-1])

    def _int(self) -> None:
        line = self._line()
        self.stack.append(False if line == b"00" else True if line == b"01" else int(line))

    def _long(self) -> None:
        line = self._line()
        self.stack.append(int(line[:-1] if line.endswith(b"L") else line))

    def _long_bytes(self, n: int) -> None:
        self.stack.append(int.from_bytes(self._take(n), "little", signed=True))

    def _unicode(self, size: int) -> None:
        self.stack.append(self._text(self._take(self._uint(size))))

    def _string(self, n: int) -> None:
        # protocol-2 byte strings (Python 2's str); torch reads them as UTF-8
        self.stack.append(self._take(n).decode("utf-8"))

    # the items come off the stack first: _pop_mark replaces self.stack
    def _tuple_mark(self) -> None:
        items = self._pop_mark()
        self.stack.append(self._tuple(items))

    def _list(self) -> None:
        items = self._pop_mark()
        self.stack.append(items)

    def _tuple_n(self, n: int) -> None:
        stack = self.stack
        if len(stack) < n:
            raise IndexError(f"{n} items needed, {len(stack)} on the stack")
        items = stack[-n:]
        del stack[-n:]
        stack.append(self._tuple(items))

    def _append(self) -> None:
        value = self.stack.pop()
        self._container(list).append(value)

    def _appends(self) -> None:
        items = self._pop_mark()
        self._container(list).extend(items)

    def _container(self, kind: type) -> Any:
        target = self.stack[-1]
        if not isinstance(target, kind):
            raise TypeError(f"adds items to {type(target).__name__}, not to a {kind.__name__}")
        return target

    def _dict(self) -> None:
        items = self._pop_mark()
        if len(items) % 2:
            raise ValueError(f"{len(items)} items do not make key-value pairs")
        self.stack.append({items[i]: items[i + 1] for i in range(0, len(items), 2)})

    def _setitem(self) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        self._container(dict)[key] = value

    def _setitems(self) -> None:
        items = self._pop_mark()
        if len(items) % 2:
            raise ValueError(f"{len(items)} items do not make key-value pairs")
        target = self._container(dict)
        for i in range(0, len(items), 2):
            target[items[i]] = items[i + 1]

    def _additems(self) -> None:
        items = self._pop_mark()
        self._container(set).update(items)

    def _frozenset(self) -> None:
        items = self._pop_mark()
        self.stack.append(self._hashable(frozenset(items), items))

    def _put(self, index: int) -> None:
        self.memo[index] = self.stack[-1]

    def _get(self, index: int) -> None:
        self.stack.append(self.memo[index])

    def _global(self) -> None:
        module = self._text(self._line())
        self._found(module, self._text(self._line()))

    def _stack_global(self) -> None:
        name = self.stack.pop()
        module = self.stack.pop()
        if type(module) is not str or type(name) is not str:
            raise TypeError(f"STACK_GLOBAL needs two strings, got {describe(module)} and "
                            f"{describe(name)}")  # fmt: skip
        self._found(module, name)

    def _found(self, module: str, name: str) -> None:
        value = self.find_global(module, name)
        if callable(value):
            self.callables[id(value)] = value
        self.stack.append(value)

    def _reduce(self) -> None:
        args = self.stack.pop()
        func = self.stack[-1]
        if self.callables.get(id(func)) is not func:
            raise TypeError(f"{describe(func)} is not a callable this file may use")
        if type(args) is not tuple:
            raise TypeError(f"the arguments are {describe(args)}, not a tuple")
        self.stack[-1] = func(*args)

    def _build(self) -> None:
        self.stack.pop()  # the state: dropped, nothing is ever set on an object
        if not self.stack:
            raise IndexError("BUILD without an object")


def _handlers() -> dict[int, Callable[[PickleReader], None]]:
    """Each opcode's handler, taking the reader (no bound methods: the reader holds no cycle)."""
    R = PickleReader
    ops: dict[str, Callable[[PickleReader], None]] = {
        "\x80": R._proto, "\x95": lambda r: r._take(8),  # PROTO, FRAME (a hint only)
        "(": R._mark, "0": R._pop, "1": R._pop_mark, "2": R._dup,
        "N": lambda r: r.stack.append(None), "\x88": lambda r: r.stack.append(True),
        "\x89": lambda r: r.stack.append(False),
        "I": R._int, "J": lambda r: r.stack.append(struct.unpack("<i", r._take(4))[0]),
        "K": lambda r: r.stack.append(r._uint(1)), "M": lambda r: r.stack.append(r._uint(2)),
        "L": R._long, "\x8a": lambda r: r._long_bytes(r._uint(1)),
        "\x8b": lambda r: r._long_bytes(struct.unpack("<i", r._take(4))[0]),
        "F": lambda r: r.stack.append(float(r._line())),
        "G": lambda r: r.stack.append(struct.unpack(">d", r._take(8))[0]),
        "X": lambda r: r._unicode(4), "\x8c": lambda r: r._unicode(1),
        "\x8d": lambda r: r._unicode(8),
        "V": lambda r: r.stack.append(r._line().decode("raw-unicode-escape")),
        "T": lambda r: r._string(struct.unpack("<i", r._take(4))[0]),
        "U": lambda r: r._string(r._uint(1)),
        "B": lambda r: r.stack.append(r._take(r._uint(4))),
        "C": lambda r: r.stack.append(r._take(r._uint(1))),
        "\x8e": lambda r: r.stack.append(r._take(r._uint(8))),
        "\x96": lambda r: r.stack.append(bytearray(r._take(r._uint(8)))),
        ")": lambda r: r.stack.append(()), "t": R._tuple_mark,
        "\x85": lambda r: r._tuple_n(1), "\x86": lambda r: r._tuple_n(2),
        "\x87": lambda r: r._tuple_n(3),
        "]": lambda r: r.stack.append([]), "l": R._list,
        "a": R._append, "e": R._appends,
        "}": lambda r: r.stack.append({}), "d": R._dict, "s": R._setitem, "u": R._setitems,
        "\x8f": lambda r: r.stack.append(set()), "\x90": R._additems, "\x91": R._frozenset,
        "p": lambda r: r._put(int(r._line())), "q": lambda r: r._put(r._uint(1)),
        "r": lambda r: r._put(r._uint(4)), "\x94": lambda r: r._put(len(r.memo)),
        "g": lambda r: r._get(int(r._line())), "h": lambda r: r._get(r._uint(1)),
        "j": lambda r: r._get(r._uint(4)),
        "c": R._global, "\x93": R._stack_global, "R": R._reduce, "b": R._build,
        "P": lambda r: r.stack.append(r.persistent_load(r._text(r._line()))),
        "Q": lambda r: r.stack.append(r.persistent_load(r.stack.pop())),
    }  # fmt: skip
    return {code.encode("latin-1")[0]: handler for code, handler in ops.items()}


_HANDLERS = _handlers()
