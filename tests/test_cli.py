"""The ``ember`` command routes its subcommands: ``guide`` (tested in tests/guide) and ``onnx``."""

from __future__ import annotations

import pytest

from ember.cli import main


def test_onnx_subcommand_goes_to_the_onnx_cli(capsys):
    assert main(["onnx", "coverage"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# ONNX import: op coverage")
    assert "| MatMul |" in out


def test_onnx_import_of_a_missing_file_is_an_error_naming_it(tmp_path, capsys):
    pytest.importorskip("onnx", reason="the onnx extra is not installed")
    missing = tmp_path / "missing.onnx"
    assert main(["onnx", "import", str(missing), "--out", str(tmp_path / "out")]) == 1
    assert str(missing) in capsys.readouterr().err


def test_unknown_commands_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fly"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'fly'" in capsys.readouterr().err
