"""The API reference builds with warnings as errors (``mkdocs build --strict``).

A docstring griffe cannot parse, a parameter documented but not in the signature, or an
object the pages name that does not exist fails the build; the second test proves that
the strict build does fail on such a reference.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def mkdocs_build(config: Path, site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    for package in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (ember's docs and test extras install it)")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_api_reference_builds_strict(tmp_path):
    result = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site", ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "WARNING" not in result.stderr
    nn_page = (tmp_path / "site" / "reference" / "nn" / "index.html").read_text()
    assert 'id="ember.nn.Linear"' in nn_page and 'id="ember.nn.LinearConfig"' in nn_page
    # the Module's generated signature, from its fields (docs/api/griffe_fields.py)
    assert "Linear(weight, bias=None)" in " ".join(nn_page.split())
    guide = (tmp_path / "site" / "index.html").read_text()
    assert "Quick start" in guide  # the README, included
    assert not (tmp_path / "site" / "griffe_fields.py").exists()


def test_a_broken_reference_fails_the_build(tmp_path):
    # a copy of the docs with one page naming an object that does not exist
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs" / "api", tmp_path / "docs" / "api")
    (tmp_path / "src").symlink_to(ROOT / "src")
    (tmp_path / "docs" / "api" / "reference" / "nn.md").write_text(
        "# ember.nn\n\n::: ember.nn.NoSuchLayer\n"
    )
    result = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site", tmp_path)
    assert result.returncode != 0
    assert "ember.nn.NoSuchLayer" in result.stderr
