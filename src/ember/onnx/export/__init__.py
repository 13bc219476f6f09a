"""ONNX export: an ember module's forward, traced through the op table, as an ONNX model.

``ember.onnx.export(module, example_inputs, path)`` is the entry point (:mod:`.export`):
this package is callable, so the name serves as the function and as the package. The
parts: :mod:`.tracer` records the op calls, :mod:`.registry` and :mod:`.rules` hold each
op's ONNX form, :mod:`.emitter` is what those write nodes with, :mod:`.symbolic` writes
sizes that follow dynamic axes, :mod:`.graph` assembles the model.
"""

import sys
import types
from typing import Any

from ember.onnx.export.errors import ExportError, ExportFileError, UnsupportedExportError
from ember.onnx.export.export import export

__all__ = ["ExportError", "ExportFileError", "UnsupportedExportError", "export"]


class _CallablePackage(types.ModuleType):
    """``ember.onnx.export`` is this package once imported; calling it exports."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return export(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
