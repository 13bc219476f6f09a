"""Program to Python source: the generated module and the record of its weights.

The generated module holds a ``Model(Module)`` whose fields are the imported weights
(``Param`` fields and ember layers), whose ``forward`` is the straight-line code of the
converters, a ``build(device)`` function that makes the model with placeholder
weights, and ``load(device)`` that fills them from the record saved beside the file.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterable
from typing import Any

import numpy as np

from ember.onnx.registry import OnnxImportError
from ember.onnx.translate import Field, Program
from ember.tensor import Tensor

# Module-level names converters may use in their lines, with the import each needs.
ALIASES = {
    "Tensor": "from ember import Tensor",
    "rt": "from ember.onnx import runtime as rt",
    "activation": "from ember.tensor import activation",
    "F": "from ember.tensor import module as F",
    "Distribution": "from ember.tensor import Distribution",
}


def runtime_globals() -> dict[str, Any]:
    """The names of :data:`ALIASES`, bound, for running converter lines at import time."""
    from ember.onnx import runtime
    from ember.tensor import Distribution, activation
    from ember.tensor import module as functional

    return {"Tensor": Tensor, "rt": runtime, "activation": activation, "F": functional,
            "Distribution": Distribution}  # fmt: skip


def instantiate(item: Field, device: Any) -> Any:
    """The value of one field on ``device``, holding the imported weights."""
    from ember.module import Param

    namespace: dict[str, Any] = runtime_globals()
    for line in item.imports:
        exec(line, namespace)
    value = eval(item.build, {**namespace, "device": device})
    if isinstance(value, Param):
        return value.with_value(Tensor.from_data(item.params[""], device).cast(value.dtype))
    return value.map(lambda path, p: p.with_value(
        Tensor.from_data(item.params[path], device).cast(p.dtype)))


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
    lines = {"from ember.backend.device import Device", "from ember.module import Module",
             "from ember import Tensor"}  # fmt: skip
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
    rendered = sorted(plain) + [
        f"from {module} import {', '.join(sorted(names, key=_isort_key))}"
        for module, names in sorted(merged.items())
    ]
    return rendered


def _isort_key(name: str) -> tuple[int, str]:
    # isort orders CONSTANTS, then Classes, then functions; "x as y" sorts by x.
    base = name.split(" as ")[0]
    group = 0 if base.isupper() else 1 if base[:1].isupper() else 2
    return group, base.lower()


def _annotation(count: int) -> str:
    return "Tensor" if count == 1 else f"tuple[{', '.join(['Tensor'] * count)}]"


def render(program: Program, name: str, source: str = "") -> str:
    """The Python source of the generated module for ``program``; its weights are the file
    ``{name}.mpk`` beside it."""
    graph = program.graph
    double = needs_double(program.fields)
    body_lines = program.lines or []
    outputs = ", ".join(expr for expr, _ in program.outputs)
    body = "\n".join([*body_lines, f"return {outputs}"])
    build_args = "".join(f"        {f.name}={f.build},\n" for f in program.fields)
    signature = ", ".join(["self", *(f"{var}: Tensor" for var, _ in program.inputs)])
    opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(graph.opsets.items()))
    origin = f" from {source}" if source else ""
    producer = f", made by {graph.producer}" if graph.producer else ""
    recorder = "NamedMpkFileRecorder(DoublePrecision)" if double else "DefaultRecorder()"
    inputs_doc = "".join(
        f"        {var}: {_describe(info)}\n" for var, info in program.inputs
    ) or "        none\n"
    fields = "".join(f"    {f.name}: {f.annotation}\n" for f in program.fields)
    if fields:
        fields = "\n" + fields
    indented = "\n".join(f"        {line}" if line else "" for line in body.splitlines())
    imports = "\n".join(_imports(program, body + build_args, double))
    build_body = f"    return Model(\n{build_args}    )" if build_args else "    return Model()"
    return f'''"""The ONNX model{origin} as an ember module (opsets: {opsets}{producer}).

Generated by ember.onnx. ``load(device)`` gives the model with its imported weights, read
from ``{name}.mpk`` beside this file; ``build(device)`` gives it with placeholder weights.
"""

from __future__ import annotations

from pathlib import Path

{imports}

WEIGHTS = "{name}.mpk"
RECORDER = {recorder}


class Model(Module):
    """The ONNX graph {graph.name!r}.

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


def _describe(info: Any) -> str:
    dims = "unknown shape" if info.shape is None else \
        "[" + ", ".join("?" if d is None else str(d) for d in info.shape) + "]"
    dtype = info.dtype.value if info.dtype is not None else "?"
    return f"{dtype} {dims} (ONNX input {info.name!r})"


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
