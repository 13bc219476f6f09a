"""ONNX import: ONNX models become ember Python code plus weights.

``import_onnx("model.onnx", "out/")`` writes ``out/model.py``, a readable module with a
``Model(ImportedModel)`` whose ``forward`` is plain ember tensor code (ember layers such as
``Linear`` where they match), and ``out/model.mpk``, its weights. The imported model is
native: it runs on every backend, trains (gradients flow through it) and saves with
ember's recorders; on a fusion device its calls replay (:class:`ImportedModel`). The
``onnx`` package is needed to import, not to run the result.

Export is the mirror: ``ember.onnx.export(module, example_inputs, "model.onnx")`` traces a
module's forward through the op table and writes it as an ONNX model
(:mod:`ember.onnx.export`, imported on first use so ``import ember.onnx`` stays light).

Converters, one per op type and opset range, live in :mod:`ember.onnx.ops` and register
with :func:`ember.onnx.registry.converter`.
"""

from ember.onnx.imported import ImportedModel
from ember.onnx.importer import Conversion, ImportResult, convert, import_onnx, load_model
from ember.onnx.registry import OnnxImportError, UnsupportedOnnxError, converter

__all__ = [
    "Conversion", "ImportResult", "ImportedModel", "OnnxImportError", "UnsupportedOnnxError",
    "convert",
    "converter", "export", "import_onnx", "load_model",
]  # fmt: skip


def __getattr__(name: str):
    # ``export`` is a callable subpackage; importing it sets the attribute for good.
    if name == "export":
        import importlib

        return importlib.import_module("ember.onnx.export")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
