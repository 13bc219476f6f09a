"""What generated code may contain, and the check that keeps a model's text out of it.

Converters write Python source, and a model is hostile input: whatever it says (names,
string attributes, dims) may reach that source only as a literal made by ``repr`` or as
an identifier ember made itself. Converters are written that way; this module checks
it, for every line a converter writes and every field's build expression, before the
line runs (at import time, when a node is folded) or becomes part of a module.

A checked line reads only:

* the module-level names of :data:`ALIASES` and the builtins of :data:`BUILTINS`;
* names ember made (:class:`ember.onnx.translate.Namer`) and names the lines bind;
* ``self.<field>`` for a field ember made;
* functions and classes that ember's runtime modules define (``rt.reshape``), never a
  module they import (``rt.np``);
* otherwise only attributes that ember's ``Tensor`` and ``Param`` have (``x.reshape``),
  never one that starts with ``_``;

and imports only functions and classes that a module of ``ember.nn`` or
``ember.onnx.ops`` defines itself. No ``exec``, ``eval``, ``open``, ``getattr`` or
``__import__`` is reachable from there.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import keyword
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from ember.onnx.registry import OnnxImportError

# Module-level names converters may use in their lines, with the import each needs.
ALIASES = {
    "Tensor": "from ember import Tensor",
    "rt": "from ember.onnx import runtime as rt",
    "host": "from ember.onnx import host",
    "activation": "from ember.tensor import activation",
    "F": "from ember.tensor import module as F",
    "Distribution": "from ember.tensor import Distribution",
}

# The builtins generated code may call; none of them runs text as code or opens a file.
BUILTINS = frozenset({
    "abs", "all", "any", "bool", "dict", "divmod", "enumerate", "float", "int", "isinstance", "len",
    "list", "max", "min", "range", "reversed", "round", "slice", "sorted", "sum", "tuple", "zip",
})  # fmt: skip

# The methods of the model (``Module``) that generated code calls: the devices it is on.
_MODEL_METHODS = frozenset({"devices"})

# The names the generated module defines or imports at its top level.
MODULE_NAMES = frozenset({
    "annotations", "Path", "Device", "Module", "Param", "DefaultRecorder", "DoublePrecision",
    "NamedMpkFileRecorder", "WEIGHTS", "RECORDER", "Model", "build", "load", "GRAPH_NAME",
    "PRODUCER", "SOURCE", "OPSETS", "ONNX_INPUTS", "ONNX_OUTPUTS", "device", "directory",
    "folder", "self", "np", "ember", "inf", "nan",
})  # fmt: skip


def reserved_names() -> frozenset[str]:
    """Names a model's value never gets: keywords, every builtin, the generated module's
    own names, the aliases, and the attributes of ``Module`` (a field named ``forward``
    or ``save_file`` would hide the method)."""
    from ember.module import Module

    module_attrs = {n for n in dir(Module) if not n.startswith("__")}
    return frozenset({*keyword.kwlist, *keyword.softkwlist, *dir(builtins), *MODULE_NAMES,
                      *ALIASES, *module_attrs})  # fmt: skip


def runtime_globals() -> dict[str, Any]:
    """The names of :data:`ALIASES`, bound, for running converter lines at import time."""
    from ember.onnx import host, runtime
    from ember.tensor import Distribution, Tensor, activation
    from ember.tensor import module as functional

    return {"Tensor": Tensor, "rt": runtime, "host": host, "activation": activation,
            "F": functional, "Distribution": Distribution}  # fmt: skip


@dataclass
class Field:
    """A field of the generated module: a Param or an ember layer.

    ``params`` maps each parameter path inside the field (``""`` for a bare Param,
    ``"weight"`` inside a layer) to its imported value.
    """

    name: str
    annotation: str
    build: str
    params: dict[str, np.ndarray]
    imports: tuple[str, ...] = ()


# ------------------------------------------------------------------------------ the check
@cache
def _alias_members() -> dict[str, frozenset[str]]:
    """Per alias, the attributes generated code may read of it."""
    found = {}
    for alias, value in runtime_globals().items():
        if isinstance(value, types.ModuleType):
            found[alias] = frozenset(n for n in dir(value) if _defined_by_ember(value, n))
        else:
            found[alias] = frozenset(n for n in dir(value) if not n.startswith("_"))
    return found


@cache
def _value_attributes() -> frozenset[str]:
    """The attributes generated code may read of a value (a tensor, a parameter, a dtype, a
    layer's output, a list of steps): those of ``Tensor``, ``Param`` and ``DType``, and a
    few of lists, dicts and the recurrent layers' states."""
    from ember.module import Param
    from ember.tensor import DType, Tensor

    names = {n for cls in (Tensor, Param, DType.F32) for n in dir(cls) if not n.startswith("_")}
    return frozenset(names | {"append", "get", "hidden", "cell"})


def _defined_by_ember(module: types.ModuleType, name: str) -> bool:
    """Whether ``module.name`` is a public function or class of ember (not a module it
    imports, like ``np``, nor a NumPy function)."""
    if name.startswith("_"):
        return False
    value = getattr(module, name, None)
    if not isinstance(value, type | types.FunctionType):
        return False
    return getattr(value, "__module__", "").startswith("ember.")


@cache
def _importable(module: str, name: str) -> bool:
    """Whether generated code may import ``name`` from ``module``: a public function or
    class that a module of ``ember.nn`` or ``ember.onnx.ops`` defines itself."""
    if not (module.startswith("ember.nn.") or module.startswith("ember.onnx.ops.")):
        return False
    if not all(part.isidentifier() for part in module.split(".")):
        return False
    try:
        loaded = importlib.import_module(module)
    except ImportError:
        return False
    value = getattr(loaded, name, None)
    return (_defined_by_ember(loaded, name)
            and getattr(value, "__module__", None) == module)  # fmt: skip


class _Checker(ast.NodeVisitor):
    """Finds the first thing in a parsed snippet that generated code may not contain."""

    # Statements a converter writes; anything else (classes, globals, plain imports,
    # with, try, async code) has no place in a forward pass.
    _STATEMENTS = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.If, ast.For,
                   ast.While, ast.Break, ast.Continue, ast.Pass, ast.ImportFrom)  # fmt: skip
    _FORBIDDEN = (ast.Import, ast.Global, ast.Nonlocal, ast.ClassDef, ast.FunctionDef,
                  ast.AsyncFunctionDef, ast.Await, ast.Yield, ast.YieldFrom, ast.With,
                  ast.AsyncWith, ast.AsyncFor, ast.Try, ast.Raise, ast.Delete, ast.Return,
                  ast.NamedExpr)  # fmt: skip

    def __init__(self, known: Callable[[str], bool], fields: Callable[[str], bool],
                 attributes: Callable[[str], bool]) -> None:  # fmt: skip
        self.known = known
        self.fields = fields
        self.attributes = attributes
        self.bound: set[str] = set()
        self.problem: str | None = None

    def fail(self, problem: str) -> None:
        if self.problem is None:
            self.problem = problem

    def generic_visit(self, node: ast.AST) -> None:
        if isinstance(node, self._FORBIDDEN):
            self.fail(f"a {type(node).__name__} statement")
            return
        super().generic_visit(node)

    def visit_Module(self, node: ast.Module) -> None:
        # Names bound anywhere in the snippet (assignments, loop and comprehension
        # targets, lambda parameters, import aliases) may be read anywhere in it.
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                self.bound.add(sub.id)
            elif isinstance(sub, ast.arg):
                self.bound.add(sub.arg)
        for statement in node.body:
            self._statement(statement)

    def _statement(self, node: ast.stmt) -> None:
        if not isinstance(node, self._STATEMENTS):
            self.fail(f"a {type(node).__name__} statement")
            return
        self.visit(node)

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        for statement in [*node.body, *node.orelse]:
            self._statement(statement)

    def visit_For(self, node: ast.For) -> None:
        self.visit(node.target)
        self.visit(node.iter)
        for statement in [*node.body, *node.orelse]:
            self._statement(statement)

    def visit_While(self, node: ast.While) -> None:
        self.visit(node.test)
        for statement in [*node.body, *node.orelse]:
            self._statement(statement)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if node.level or node.module is None or not _importable(node.module, alias.name):
                self.fail(f"an import of {alias.name!r} from {node.module!r}")
            elif alias.asname is not None and alias.asname.startswith("_"):
                self.fail(f"an import as {alias.asname!r}")
            else:
                self.bound.add(alias.asname or alias.name)

    def visit_Name(self, node: ast.Name) -> None:
        name = node.id
        if isinstance(node.ctx, ast.Store):
            if name in ALIASES or name in BUILTINS or name == "self":
                self.fail(f"an assignment to {name!r}")
            return
        if not (name in ALIASES or name in BUILTINS or name == "self" or name in self.bound
                or self.known(name)):  # fmt: skip
            self.fail(f"the name {name!r}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        attr, owner = node.attr, node.value
        if attr.startswith("_"):
            self.fail(f"the attribute {attr!r}")
            return
        if isinstance(owner, ast.Name) and owner.id == "self":
            if not (self.fields(attr) or attr in _MODEL_METHODS):
                self.fail(f"the attribute self.{attr}")
            return
        if isinstance(owner, ast.Name) and owner.id in ALIASES and owner.id not in self.bound:
            if attr not in _alias_members()[owner.id]:
                self.fail(f"the attribute {owner.id}.{attr}")
            return
        if not self.attributes(attr):
            self.fail(f"the attribute {attr!r}")
            return
        self.visit(owner)


def _problem(source: str, mode: str, known: Callable[[str], bool],
             fields: Callable[[str], bool],
             attributes: Callable[[str], bool] | None = None) -> str | None:  # fmt: skip
    """What ``source`` holds that generated code may not, or None when it is clean."""
    if "\x00" in source:
        return "a NUL character"
    try:
        tree = ast.parse(source, mode=mode)
    except SyntaxError as error:
        return f"code that does not parse ({error.msg}, line {error.lineno})"
    checker = _Checker(known, fields, attributes or _value_attributes().__contains__)
    if isinstance(tree, ast.Expression):
        checker.visit(tree.body)
    else:
        checker.visit(tree)
    return checker.problem


def check_lines(lines: Iterable[str], where: str, known: Callable[[str], bool],
                fields: Callable[[str], bool]) -> None:  # fmt: skip
    """Raises :class:`OnnxImportError` unless ``lines`` stay within generated code's
    vocabulary (see the module's docstring).

    Args:
        lines: the source lines a converter wrote.
        where: what wrote them, for the message (``"node 'conv1' (Conv)"``).
        known: whether a free name is one ember made (a local variable, a folded value).
        fields: whether ``self.<name>`` is a field ember made.
    """
    source = "\n".join(lines)
    problem = _problem(source, "exec", known, fields)
    if problem is not None:
        raise OnnxImportError(f"ONNX import: {where}: the converter wrote {problem}, which "
                              f"generated code may not contain; refusing the model "
                              f"(code: {_excerpt(source)})")


def check_field(item: Field, where: str) -> None:
    """Raises :class:`OnnxImportError` unless ``item``'s imports and build expression stay
    within generated code's vocabulary: imports of ember layers, a call on literals and
    ``device``."""
    for line in item.imports:
        problem = _problem(line, "exec", lambda _: False, lambda _: False)
        if problem is None and not all(isinstance(s, ast.ImportFrom)
                                       for s in ast.parse(line).body):  # fmt: skip
            problem = "a statement other than an import"
        if problem is not None:
            raise OnnxImportError(f"ONNX import: {where}: field {item.name!r} has the import "
                                  f"{_excerpt(line)}: {problem}")
    known = imported_names(item) | {"device"}
    problem = _problem(item.build, "eval", known.__contains__, lambda _: False,
                       _build_attribute)
    if problem is None and not item.annotation.isidentifier():
        problem = f"the annotation {item.annotation!r}"
    if problem is not None:
        raise OnnxImportError(f"ONNX import: {where}: field {item.name!r} is built by "
                              f"{_excerpt(item.build)}, which holds {problem}")


def imported_names(item: Field) -> set[str]:
    """The names ``item``'s import lines bind at the generated module's top level (checked
    by :func:`check_field` first)."""
    names: set[str] = set()
    for line in item.imports:
        for statement in ast.parse(line).body:
            if isinstance(statement, ast.ImportFrom):
                names.update(a.asname or a.name for a in statement.names)
    return names


def _build_attribute(name: str) -> bool:
    """The attributes a build expression may read of a layer's config: ``init``, the
    ``with_*`` setters and variants (``PaddingConfig.Explicit``), not ``save`` or ``load``."""
    return name == "init" or name.startswith("with_") or name[:1].isupper()


def _excerpt(source: str, limit: int = 200) -> str:
    text = source if len(source) <= limit else source[:limit] + "..."
    return repr(text)


def instantiate(item: Field, device: Any) -> Any:
    """The value of one field on ``device``, holding the imported weights."""
    from ember.module import Param
    from ember.tensor import Tensor

    check_field(item, f"field {item.name!r}")
    namespace: dict[str, Any] = runtime_globals()
    for line in item.imports:
        exec(line, namespace)
    value = eval(item.build, {**namespace, "device": device})
    if isinstance(value, Param):
        return value.with_value(Tensor.from_data(item.params[""], device).cast(value.dtype))
    return value.map(lambda path, p: p.with_value(
        Tensor.from_data(item.params[path], device).cast(p.dtype)))
