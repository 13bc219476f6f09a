"""ONNX import: ONNX models become ember Python code plus weights.

``import_onnx("model.onnx", "out/")`` writes ``out/model.py``, a readable module with a
``Model(Module)`` whose ``forward`` is plain ember tensor code (ember layers such as
``Linear`` where they match), and ``out/model.mpk``, its weights. The imported model is
native: it runs on every backend, trains (gradients flow through it) and saves with
ember's recorders. The ``onnx`` package is needed to import, not to run the result.

Converters, one per op type and opset range, live in :mod:`ember.onnx.ops` and register
with :func:`ember.onnx.registry.converter`.
"""

from ember.onnx.importer import Conversion, ImportResult, convert, import_onnx, load_model
from ember.onnx.registry import OnnxImportError, UnsupportedOnnxError, converter

__all__ = [
    "Conversion", "ImportResult", "OnnxImportError", "UnsupportedOnnxError", "convert",
    "converter", "import_onnx", "load_model",
]  # fmt: skip
