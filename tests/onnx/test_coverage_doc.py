"""The committed op coverage table, docs/onnx_coverage.md, is the one the registry gives now."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

pytest.importorskip("onnx", reason="the coverage table lists ONNX's ops from the onnx package")

from ember.onnx.cli import main as cli_main
from ember.onnx.coverage import coverage_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "onnx_coverage.md"
REGENERATE = "run `ember onnx coverage --out docs/onnx_coverage.md`"


def test_the_coverage_command_writes_the_table(tmp_path, capsys):
    out = tmp_path / "coverage.md"
    assert cli_main(["coverage", "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert out.read_text(encoding="utf-8") == coverage_table()


def test_committed_coverage_table_is_up_to_date():
    assert DOC.is_file(), f"{DOC} is missing: {REGENERATE}"
    committed = DOC.read_text(encoding="utf-8")
    current = coverage_table()
    if committed != current:
        diff = "\n".join(list(difflib.unified_diff(
            committed.splitlines(), current.splitlines(), "committed", "registry", lineterm="",
        ))[:40])  # fmt: skip
        pytest.fail(f"docs/onnx_coverage.md is out of date with the converter registry: "
                    f"{REGENERATE}\n{diff}")
