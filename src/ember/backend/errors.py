"""ember's error hierarchy.

Every error ember raises on bad input is an :class:`EmberError` *and* the
built-in exception a Python user would catch for the same mistake, so
``except ValueError`` keeps working while ``except ember.EmberError`` catches
everything the framework rejects.
"""

from __future__ import annotations


class EmberError(Exception):
    """Base class of every error raised by ember on bad input."""


class ShapeError(EmberError, ValueError):
    """Shapes that do not fit the op (broadcasting, matmul, reshape, ...)."""


class KindError(EmberError, TypeError):
    """An op was called on a tensor kind (Float, Int, Bool) it is not defined for."""


class DTypeError(EmberError, TypeError):
    """An unknown dtype, or a dtype that does not fit the op."""


class DeviceError(EmberError, ValueError):
    """Tensors on different devices, or an unknown / unavailable device."""


class ArgumentError(EmberError, ValueError):
    """An attribute of an op (dim, index, size, mode, ...) that is out of range or invalid."""


class EmberIndexError(EmberError, IndexError):
    """An index or slice outside a tensor's bounds."""


class UnsupportedError(EmberError, NotImplementedError):
    """The backend does not implement this op or does not support this dtype."""


class BackendUnavailableError(EmberError, ImportError):
    """A backend whose optional dependency is not installed."""


def fmt_shape(shape) -> str:
    """Formats a shape the way every ember message shows it: ``[2, 3]``."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


class ConfigError(EmberError, ValueError):
    """A config that does not validate: a wrong type, a missing or unknown field, bad JSON.

    The message names the offending field path (``TrainingConfig.model.hidden_size``) and,
    when the config came from a file, that file. ``fields`` holds the field paths and
    ``file`` the file path (or ``None``).
    """

    def __init__(self, message: str, fields: tuple[str, ...] = (), file: str | None = None):
        super().__init__(message)
        self.fields = tuple(fields)
        self.file = file


class ConfigFileNotFoundError(ConfigError, FileNotFoundError):
    """A config file to load, or the directory to save one into, does not exist."""


class RecordError(EmberError, ValueError):
    """A record (saved module or optimizer state) that cannot be read or does not fit.

    ``path`` is the parameter path the problem is at (``encoder.layers.0.weight``), or
    ``None`` when it concerns the whole record; ``file`` is the file involved, or ``None``.
    """

    def __init__(self, message: str, path: str | None = None, file: str | None = None):
        super().__init__(message)
        self.path = path
        self.file = file


class RecordFormatError(RecordError):
    """A file or byte string that is not in the recorder's format: corrupt, truncated,
    written by another recorder, or by a newer ember."""


class RecordMismatchError(RecordError):
    """A record that does not fit the module: a missing or unexpected key, a shape or
    kind mismatch. The message names the parameter path and both sides."""


class RecordFileNotFoundError(RecordError, FileNotFoundError):
    """A record file to load, or the directory to save one into, does not exist."""


class UnsafePickleError(RecordError):
    """A pickle (PyTorch weight file) that references something other than tensors,
    storages and plain containers; nothing from it is executed."""


class UnsafeCacheError(ConfigError):
    """A kernel cache folder (``EMBER_FUSION_CACHE``), a folder above it, or a file in it
    that someone other than this user could write: ember runs compiled code from that
    folder, so it does not use it. ``file`` is the path."""
