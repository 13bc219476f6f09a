"""The Python API of ONNX import: a model file in, a Python module and its weights out.

:func:`import_onnx` writes ``{name}.py`` (a readable module with ``Model``, ``build``
and ``load``) and ``{name}.mpk`` (the weights, saved with ember's NamedMpk recorder)
into a directory; :func:`load_model` gives the model back from there. :func:`convert`
does the same in memory, for tests and tools that do not need the files.

The generated module is Python: loading it runs it. A model's text reaches it only as
``repr`` literals and identifiers ember made, so importing a hostile model is safe; a
``.py`` file from elsewhere is code like any other, so load only modules you generated.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ember.atomic import atomic_write
from ember.backend.device import Device
from ember.module import Module
from ember.onnx import codegen
from ember.onnx.ir import Graph, parse
from ember.onnx.registry import OnnxFileNotFoundError, OnnxImportError
from ember.onnx.translate import Program, translate


@dataclass
class Conversion:
    """An imported model held in memory: the graph, the program and the generated source."""

    graph: Graph
    program: Program
    source: str
    name: str

    @property
    def input_names(self) -> list[str]:
        """The ONNX names of the model's inputs, in ``forward``'s order."""
        return [info.name for _, info in self.program.inputs]

    @property
    def output_names(self) -> list[str]:
        return [info.name for _, info in self.program.outputs]

    def module(self) -> types.ModuleType:
        """The generated source run as a Python module."""
        digest = hashlib.sha1(self.source.encode()).hexdigest()[:12]
        return codegen.exec_module(self.source, f"ember_onnx_generated.{self.name}_{digest}")

    def build(self, device: Device | None = None) -> Module:
        """The model on ``device`` holding the imported weights."""
        return codegen.build_with_weights(self.module(), self.program, device)


def convert(model: Any, *, name: str = "model", source: str = "") -> Conversion:
    """Translates a model (a path, bytes or ``ModelProto``) without writing files.

    Raises:
        UnsupportedOnnxError: a node the importer cannot translate (the message names it).
        OnnxImportError: a malformed model.
    """
    if not name.isidentifier():
        raise OnnxImportError(f"ONNX import: name {name!r} is not a Python identifier")
    if not source and isinstance(model, str | Path):
        source = Path(model).name
    graph = parse(model)
    program = translate(graph)
    return Conversion(graph, program, codegen.render(program, name, source), name)


@dataclass(frozen=True)
class ImportResult:
    """What :func:`import_onnx` wrote.

    Attributes:
        code: the generated module (``{name}.py``).
        weights: the weights record (``{name}.mpk``).
        inputs: the ONNX names of the model's inputs, in ``forward``'s order.
        outputs: the ONNX names of its outputs.
        opsets: the opset version per domain.
    """

    code: Path
    weights: Path
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    opsets: dict[str, int]


def import_onnx(model: Any, out_dir: str | Path, *, name: str = "model") -> ImportResult:
    """Imports an ONNX model as ember Python code plus weights.

    Args:
        model: a path to a ``.onnx`` file, its bytes, or an ``onnx.ModelProto``.
        out_dir: the directory to write into (created if missing).
        name: the stem of the files written (a Python identifier).

    Returns:
        an :class:`ImportResult` naming the files.

    Raises:
        UnsupportedOnnxError: a node the importer cannot translate; the message names the
            node, its op and opset, and what would be needed.

    Example:
        >>> import tempfile
        >>> from onnx import TensorProto, helper
        >>> graph = helper.make_graph(
        ...     [helper.make_node("Relu", ["x"], ["y"])], "g",
        ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])])
        >>> out = tempfile.mkdtemp()
        >>> result = import_onnx(helper.make_model(graph), out, name="relu")
        >>> result.code.name, result.weights.name
        ('relu.py', 'relu.mpk')
    """
    conversion = convert(model, name=name)
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    code = folder / f"{name}.py"
    atomic_write(code, conversion.source.encode("utf-8"))
    module = conversion.module()
    model_ = codegen.build_with_weights(module, conversion.program, None)
    weights = model_.save_file(folder / name, module.RECORDER)
    return ImportResult(code, weights, tuple(conversion.input_names),
                        tuple(conversion.output_names), dict(conversion.graph.opsets))


def load_model(out_dir: str | Path, device: Device | None = None, *, name: str = "model") -> Module:
    """The model :func:`import_onnx` wrote to ``out_dir``, with its weights, on ``device``.

    This runs ``{name}.py`` as Python: load only a folder that :func:`import_onnx` (or
    ``ember onnx import``) wrote for you, as you would run only code you trust.
    """
    if not name.isidentifier():
        raise OnnxImportError(f"ONNX import: name {name!r} is not a Python identifier")
    code = Path(out_dir) / f"{name}.py"
    if not code.is_file():
        raise OnnxFileNotFoundError(f"ONNX import: no generated module at {code} "
                                f"(run import_onnx first)")
    digest = hashlib.sha1(str(code.resolve()).encode()).hexdigest()[:12]
    module_name = f"ember_onnx_generated.{name}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, code)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module.load(device, code.parent)
