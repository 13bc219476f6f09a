"""Program to Python source: the generated module and the record of its weights.

The generated module holds a ``Model(ImportedModel)`` whose fields are the imported weights
(``Param`` fields and ember layers), whose ``forward`` is the straight-line code of the
converters, a ``build(device)`` function that makes the model with placeholder
weights, and ``load(device)`` that fills them from the record saved beside the file.

A model's own text (its graph, input and output names, producer, opset domains, the
file it came from) is kept as module constants written with ``repr``, never inside a
docstring or a comment, where a quote or a backslash in it could end the string; the
code itself reads only names ember made (see :mod:`ember.onnx.vocabulary`).
"""

from __future__ import annotations

import ast
import re
import sys
import types
from collections.abc import Iterable
from typing import Any

import numpy as np

from ember.onnx.registry import OnnxImportError
from ember.onnx.translate import Namer, Program
from ember.onnx.vocabulary import ALIASES, Field, instantiate, runtime_globals
from ember.tensor import Tensor

__all__ = ["ALIASES", "build_with_weights", "exec_module", "instantiate", "needs_double",
           "render", "runtime_globals"]  # fmt: skip


def needs_double(fields: Iterable[Field]) -> bool:
    """Whether the weights need a double-precision record (f64, or i64 beyond i32's range)."""
    for item in fields:
        for value in item.params.values():
            if value.dtype == np.float64:
                return True
            if value.dtype == np.int64 and value.size and (
                value.max() > np.iinfo(np.int32).max or value.min() < np.iinfo(np.int32).min
            ):
                return True
    return False


def _imports(program: Program, body: str, double: bool) -> list[str]:
    lines = {"from ember.backend.device import Device",
             "from ember.onnx.imported import ImportedModel", "from ember import Tensor"}  # fmt: skip
    if double:
        lines.add("from ember.record import DoublePrecision, NamedMpkFileRecorder")
    else:
        lines.add("from ember.record import DefaultRecorder")
    if any(f.annotation == "Param" for f in program.fields):
        lines.add("from ember.module import Param")
    for alias, line in ALIASES.items():
        if re.search(rf"(?<![\w.]){alias}\.", body):
            lines.add(line)
    for item in program.fields:
        lines.update(item.imports)
    merged: dict[str, set[str]] = {}
    plain: set[str] = set()
    for line in lines:
        match = re.fullmatch(r"from (\S+) import (.+)", line)
        if match is None:
            plain.add(line)
            continue
        merged.setdefault(match[1], set()).update(n.strip() for n in match[2].split(","))
    rendered = sorted(plain)
    for module, names in sorted(merged.items()):
        # isort keeps an ``as`` import on a line of its own, after the module's plain names.
        plain_names = sorted((n for n in names if " as " not in n), key=_isort_key)
        if plain_names:
            rendered.append(f"from {module} import {', '.join(plain_names)}")
        rendered += [f"from {module} import {n}" for n in sorted(names - set(plain_names))]
    return rendered


def _isort_key(name: str) -> tuple[int, str]:
    # isort orders CONSTANTS, then Classes, then functions; "x as y" sorts by x.
    base = name.split(" as ")[0]
    group = 0 if base.isupper() else 1 if base[:1].isupper() else 2
    return group, base.lower()


def _annotation(count: int) -> str:
    return "Tensor" if count == 1 else f"tuple[{', '.join(['Tensor'] * count)}]"


def _constant(name: str, value: Any) -> str:
    """``NAME = <repr of value>``; a tuple or dict too long for one line gets a line per item."""
    line = f"{name} = {value!r}"
    if len(line) <= 100 or not value or not isinstance(value, tuple | dict):
        return line
    if isinstance(value, dict):
        items = "".join(f"    {k!r}: {v!r},\n" for k, v in value.items())
        return f"{name} = {{\n{items}}}"
    return f"{name} = (\n{''.join(f'    {v!r},{chr(10)}' for v in value)})"


def _metadata(program: Program, source: str) -> str:
    """The model's own text as module constants, each value written by ``repr``."""
    graph = program.graph
    opsets = {domain or "ai.onnx": version for domain, version in sorted(graph.opsets.items())}
    constants = [
        ("GRAPH_NAME", graph.name),
        ("SOURCE", source),
        ("PRODUCER", graph.producer),
        ("OPSETS", opsets),
        ("ONNX_INPUTS", tuple(info.name for _, info in program.inputs)),
        ("ONNX_OUTPUTS", tuple(info.name for _, info in program.outputs)),
    ]
    return "\n".join(_constant(key, value) for key, value in constants)


def render(program: Program, name: str, source: str = "") -> str:
    """The Python source of the generated module for ``program``; its weights are the file
    ``{name}.mpk`` beside it. ``source`` names the model file, kept as data (``SOURCE``).

    Raises:
        OnnxImportError: ``name`` is not an identifier, or the module would not parse
            (which a converter's bug, never a model's text, could cause).
    """
    if not name.isidentifier():
        raise OnnxImportError(f"ONNX import: name {name!r} is not a Python identifier")
    double = needs_double(program.fields)
    body_lines = program.lines or []
    outputs = ", ".join(expr for expr, _ in program.outputs)
    body = "\n".join([*body_lines, f"return {outputs}"])
    build_args = "".join(f"        {f.name}={f.build},\n" for f in program.fields)
    signature = ", ".join(["self", *(f"{var}: Tensor" for var, _ in program.inputs)])
    recorder = "NamedMpkFileRecorder(DoublePrecision)" if double else "DefaultRecorder()"
    inputs_doc = "".join(
        f"        {var}: {_describe(info, i)}\n" for i, (var, info) in enumerate(program.inputs)
    ) or "        none\n"
    fields = "".join(f"    {f.name}: {f.annotation}\n" for f in program.fields)
    if fields:
        fields = "\n" + fields
    indented = "\n".join(f"        {line}" if line else "" for line in body.splitlines())
    imports = "\n".join(_imports(program, body + build_args, double))
    build_body = f"    return Model(\n{build_args}    )" if build_args else "    return Model()"
    text = f'''"""An ONNX model imported as an ember module.

Generated by ember.onnx. ``load(device)`` gives the model with its imported weights, read
from the file ``WEIGHTS`` beside this file; ``build(device)`` gives it with placeholder
weights. What the model says of itself is data here: ``GRAPH_NAME``, ``SOURCE`` (the
file it was imported from), ``PRODUCER``, ``OPSETS``, ``ONNX_INPUTS`` and ``ONNX_OUTPUTS``
(its inputs' and outputs' names, in ``forward``'s order).
"""

from __future__ import annotations

from pathlib import Path

{imports}

{_metadata(program, source)}
WEIGHTS = {name + ".mpk"!r}
RECORDER = {recorder}


class Model(ImportedModel):
    """The ONNX graph ``GRAPH_NAME``.

    Args:
{inputs_doc}    """
{fields}
    def forward({signature}) -> {_annotation(len(program.outputs))}:
{indented}


def build(device: Device | None = None) -> Model:
    """The model on ``device`` with placeholder weights (``load`` fills them)."""
{build_body}


def load(device: Device | None = None, directory: str | Path | None = None) -> Model:
    """The model on ``device`` with the imported weights, read from ``directory`` (by
    default, this file's directory)."""
    folder = Path(directory) if directory is not None else Path(__file__).parent
    return build(device).load_file(folder / WEIGHTS, RECORDER, device)
'''
    try:
        ast.parse(text)
    except SyntaxError as error:
        raise OnnxImportError(f"ONNX import: the generated module does not parse "
                              f"({error.msg}, line {error.lineno}): a converter wrote bad "
                              f"code") from None
    return text


def _describe(info: Any, index: int) -> str:
    """An input's dtype and dims for the docstring: a dynamic dim by its name made an
    identifier (the name itself is model text, which a docstring must not hold)."""
    dims = "unknown shape" if info.shape is None else "[" + ", ".join(
        "?" if d is None else str(d) if isinstance(d, int) else Namer.sanitize(d)
        for d in info.shape) + "]"  # fmt: skip
    dtype = info.dtype.value if info.dtype is not None else "?"
    return f"{dtype} {dims} (ONNX_INPUTS[{index}])"


def exec_module(source: str, module_name: str, filename: str = "<ember.onnx>") -> types.ModuleType:
    """Runs generated ``source`` as a module named ``module_name`` (registered in
    ``sys.modules`` so its dataclasses resolve)."""
    module = types.ModuleType(module_name)
    module.__file__ = filename
    sys.modules[module_name] = module
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def build_with_weights(module: types.ModuleType, program: Program, device: Any) -> Any:
    """``module.build(device)`` with the imported weights put in (no file involved)."""
    model = module.build(device)
    by_path: dict[str, np.ndarray] = {}
    for item in program.fields:
        for path, value in item.params.items():
            by_path[f"{item.name}.{path}" if path else item.name] = value
    seen: set[str] = set()

    def fill(path: str, param: Any) -> Any:
        seen.add(path)
        return param.with_value(Tensor.from_data(by_path[path], param.device).cast(param.dtype))

    model = model.map(fill)
    missing = sorted(set(by_path) - seen)
    if missing:
        raise OnnxImportError(f"ONNX import: the generated module has no parameters at {missing}")
    return model
