"""``import ember`` is light, and its subpackages are attributes that import on first use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import ember

HEAVY = ("torch", "onnx", "onnxruntime", "numba", "textual")
SRC = str(Path(ember.__file__).resolve().parent.parent)


def run_python(code: str) -> str:
    """Runs ``code`` in a fresh interpreter that imports this checkout's ember."""
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_import_ember_loads_no_heavy_library_and_no_lazy_subpackage() -> None:
    out = run_python(
        "import sys, ember\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {set(HEAVY)!r}))\n"
        "print(sorted(n for n in ember._LAZY_SUBPACKAGES if 'ember.' + n in sys.modules))"
    )
    heavy, lazy = out.splitlines()
    assert heavy == "[]"
    # ember.backends holds the backends' registry, which ember.device needs at once.
    assert lazy == "['backends']"


def test_subpackages_are_attributes_after_a_plain_import() -> None:
    out = run_python(
        "import ember\n"
        "layer = ember.nn.Linear\n"
        "print(layer.__module__, ember.optim.Adam.__name__, ember.train.LearnerBuilder.__name__,"
        " ember.data.DataLoaderBuilder.__name__)"
    )
    assert out == "ember.nn.linear Adam LearnerBuilder DataLoaderBuilder"


def test_every_lazy_name_is_the_subpackage_and_is_listed_by_dir() -> None:
    import importlib

    for name in sorted(ember._LAZY_SUBPACKAGES):
        if name in {"onnx", "quantization"}:  # their imports are tested in their own suites
            continue
        assert getattr(ember, name) is importlib.import_module(f"ember.{name}")
        assert name in dir(ember)


def test_an_unknown_attribute_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="'no_such_thing'"):
        _ = ember.no_such_thing  # type: ignore[attr-defined]
    assert not hasattr(ember, "tests")


def test_the_package_is_marked_typed() -> None:
    assert (Path(ember.__file__).parent / "py.typed").is_file()
