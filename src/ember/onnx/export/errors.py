"""The errors of ONNX export.

Every one is an :class:`ember.EmberError`: a model that cannot be exported, an op without an
ONNX form (named with the module path where it ran), or a path that cannot be written.
"""

from __future__ import annotations

from ember.backend.errors import EmberError, UnsupportedError


class ExportError(EmberError, ValueError):
    """A model that cannot be exported to ONNX: the message says what and where."""


class UnsupportedExportError(ExportError, UnsupportedError):
    """An op (or an attribute value of one) that has no ONNX form.

    The message names the op, the backend primitive and the module path where it ran; the
    same facts are the attributes ``op``, ``primitive``, ``module_path`` and ``reason``.
    """

    def __init__(self, op: str, primitive: str, module_path: str, reason: str) -> None:
        where = module_path or "<the exported module itself>"
        super().__init__(f"ONNX export: op {op!r} (primitive {primitive}) in module {where!r} "
                         f"has no ONNX form: {reason}")
        self.op = op
        self.primitive = primitive
        self.module_path = module_path
        self.reason = reason


class ExportFileError(ExportError, OSError):
    """The ONNX file cannot be written (a missing or unwritable folder, a directory in the
    way). Nothing is left at the path: the write is atomic."""
