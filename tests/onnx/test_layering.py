"""The importer's modules depend one way: model file -> IR -> node context -> translation ->
code generation -> the importer's API, as ember's other layers do.

The test reads each module of ``ember.onnx`` with ``ast`` (every import: at the top, inside
functions, under ``TYPE_CHECKING``) and checks that a module imports only modules below it,
and that the package's imports have no cycle at all.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

import ember.onnx

PACKAGE = Path(ember.onnx.__file__).parent

# Bottom to top. The registry (converter table, error types) and the runtime helpers sit
# below all of them; the converters (ember.onnx.ops) sit on the node context.
LAYERS = [
    "ember.onnx.ir",
    "ember.onnx.host",
    "ember.onnx.vocabulary",
    "ember.onnx.context",
    "ember.onnx.translate",
    "ember.onnx.codegen",
    "ember.onnx.importer",
]
BASE = {"ember.onnx.registry", "ember.onnx.runtime"}
# What the package's front door and tools may import: everything.
TOP = {"ember.onnx", "ember.onnx.cli", "ember.onnx.coverage"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(module: str) -> set[str]:
    """The ``ember.onnx`` modules ``module`` imports anywhere in its source."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and not node.level:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                # ``from ember.onnx import runtime`` imports the submodule runtime.
                found.add(child if child in MODULES else node.module)
    return {m for m in found if m in MODULES and m != module}


def test_the_layers_exist():
    assert set(LAYERS) | BASE <= set(MODULES)


def reachable_from(module: str) -> set[str]:
    """Every module ``module`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for imported in imports_of(todo.pop()):
            if imported not in seen:
                seen.add(imported)
                todo.append(imported)
    return seen


@pytest.mark.parametrize("module", LAYERS)
def test_a_layer_reaches_no_layer_above_it(module):
    """Directly or through a helper module (a module outside the list, such as a shape
    inference pass, may sit between two layers)."""
    above = set(LAYERS[LAYERS.index(module):]) | TOP
    reached = reachable_from(module) & above
    assert not reached, f"{module} imports {sorted(reached)}"


@pytest.mark.parametrize("module", sorted(BASE))
def test_the_base_modules_import_no_layer(module):
    # The registry finds the converters by listing the ``ember.onnx.ops`` package (whose
    # __init__ imports nothing) and importing its modules by name, on first lookup.
    assert imports_of(module) <= BASE - {module} | {"ember.onnx.ops"}
    assert imports_of("ember.onnx.ops") == set()


def test_converters_sit_on_the_node_context():
    allowed = {"ember.onnx.ir", "ember.onnx.context", *BASE} | {
        m for m in MODULES if m.startswith("ember.onnx.ops")}
    for module in MODULES:
        if module.startswith("ember.onnx.ops."):
            assert imports_of(module) <= allowed, f"{module}: {sorted(imports_of(module) - allowed)}"


def test_the_package_has_no_import_cycle():
    graph = {m: imports_of(m) for m in MODULES}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = path[path.index(module):] + [module]
            raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_the_layers_are_stacked():
    """Each stage builds on the one before (the vocabulary and the host rules are the
    translator's, beside the node context)."""
    beside = {"ember.onnx.vocabulary", "ember.onnx.host"}
    chain = [m for m in LAYERS if m not in beside]
    for lower, upper in itertools.pairwise(chain):
        assert lower in imports_of(upper), f"{upper} does not build on {lower}"
    assert beside <= imports_of("ember.onnx.translate")


def test_the_check_sees_lazy_and_type_checking_imports():
    """The parser counts imports inside functions and under TYPE_CHECKING (a cycle hides
    there as well as at the top)."""
    assert "ember.onnx.importer" in imports_of("ember.onnx.cli")  # imported inside main()
    assert "ember.onnx.coverage" in imports_of("ember.onnx.cli")
    assert set(MODULES) >= TOP
