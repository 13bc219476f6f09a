"""ember's public API passes mypy at the level pyproject.toml's [tool.mypy] sets (see the
README), and a user's type checker sees ember's annotations (py.typed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip


def test_the_public_api_type_checks_and_a_misuse_is_reported(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy is not installed (the test extra installs it)")
    done = mypy()  # the files and the level of pyproject.toml
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("Success: no issues found")

    # The same checker sees ember's types through the lazy attributes: a wrong argument
    # and a misspelt method of user code are errors (the cache of the run above is reused).
    misuse = tmp_path / "misuse.py"
    misuse.write_text("import ember\n"
                      "ember.train.LearnerBuilder(42)\n"
                      "ember.train.LearnerBuilder('run').num_epoch(3)\n")  # fmt: skip
    done = mypy(str(misuse))
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'Argument 1 to "LearnerBuilder" has incompatible type "int"' in done.stdout
    assert '"LearnerBuilder" has no attribute "num_epoch"' in done.stdout
