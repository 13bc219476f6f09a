"""The layering of the backend packages: ``ember.backend`` (the protocol, devices, the op
table) is the lowest layer and imports nothing from ``ember.backends`` (the backends and the
decorators built on it); decorators reach devices through ``register_decorator``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ember
from ember.backend import register_decorator
from ember.backend.errors import DeviceError
from ember.backends.trace import Trace

BACKEND = Path(ember.__file__).parent / "backend"


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, at any depth (function bodies included), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package ember.backend
                base = "ember.backend" if node.level == 1 else "ember"
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


# The package's __init__ is the facade that re-exports the built-in base backends
# (``from ember.backend import NdArray``); the protocol modules themselves stay below them.
PROTOCOL_MODULES = sorted(p for p in BACKEND.glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", PROTOCOL_MODULES, ids=lambda p: p.name)
def test_backend_module_imports_nothing_from_backends(path: Path) -> None:
    above = [
        f"{path.name}:{line} imports {module}"
        for line, module in _imported_modules(path)
        if module == "ember.backends" or module.startswith("ember.backends.")
    ]
    assert above == []


def test_the_checker_sees_a_nested_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from ember.backends.autodiff import Autodiff\n")
    assert (2, "ember.backends.autodiff") in _imported_modules(source)


def test_protocol_modules_are_found() -> None:
    assert {"device.py", "decorator.py", "base.py", "ops.py"} <= {p.name for p in PROTOCOL_MODULES}


def test_autodiff_and_fusion_come_from_the_registry() -> None:
    device = ember.device("ndarray")
    assert device.autodiff().backend.name == "autodiff<ndarray>"
    assert device.decorate("autodiff") == device.autodiff()
    assert device.autodiff(checkpointing="balanced").backend.checkpointing == "balanced"


def test_a_later_decorator_registers_itself() -> None:
    register_decorator("silent_trace", lambda inner: Trace(inner, on_op=lambda record: None))
    device = ember.device("ndarray").decorate("silent_trace")
    assert isinstance(device.backend, Trace)
    assert device.inner() == ember.device("ndarray")


def test_an_unknown_decorator_is_a_device_error() -> None:
    with pytest.raises(DeviceError, match=r"unknown decorator 'nope'; registered decorators: .*autodiff"):
        ember.device("ndarray").decorate("nope")
