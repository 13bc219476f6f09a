"""The ``ember onnx`` command: ``import MODEL --out DIR [--name NAME]`` and ``coverage``.

``main(argv)`` parses the arguments after ``ember onnx`` and returns an exit status.
What it prints of a model (names in messages) has its control characters escaped, so a
hostile name cannot move the cursor or rewrite the terminal.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ember.backend.errors import EmberError


def parser() -> argparse.ArgumentParser:
    """The argument parser of ``ember onnx``."""
    root = argparse.ArgumentParser(prog="ember onnx", description="Import ONNX models as ember "
                                   "Python code plus weights.")  # fmt: skip
    commands = root.add_subparsers(dest="command", required=True)
    imp = commands.add_parser("import", help="write MODEL as a Python module and its weights")
    imp.add_argument("model", type=Path, help="the .onnx file")
    imp.add_argument("--out", type=Path, required=True, help="the directory to write into")
    imp.add_argument("--name", default="model", help="stem of the files written (default: model)")
    cov = commands.add_parser("coverage", help="print the table of supported ONNX ops")
    cov.add_argument("--out", type=Path, default=None, help="write the table to this file")
    return root


def printable(text: str) -> str:
    """``text`` with every character that is not printable (newlines, escape sequences,
    unicode line separators) written as a Python escape (``\\n``, ``\\x1b``)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``ember onnx`` with ``argv`` (the arguments after ``onnx``); returns the exit status."""
    args = parser().parse_args(argv)
    if args.command == "coverage":
        from ember.onnx.coverage import coverage_table

        table = coverage_table()
        if args.out is not None:
            args.out.write_text(table, encoding="utf-8")
            print(f"wrote {args.out}")
        else:
            print(table, end="")
        return 0
    from ember.onnx.importer import import_onnx

    try:
        result = import_onnx(args.model, args.out, name=args.name)
    except (EmberError, FileNotFoundError) as error:
        print(f"ember onnx import: {printable(str(error))}", file=sys.stderr)
        return 1
    print(f"wrote {result.code} and {result.weights}")
    print(printable(f"inputs: {', '.join(map(repr, result.inputs))}; "
                    f"outputs: {', '.join(map(repr, result.outputs))}"))
    print(f"use it: load_model({str(result.code.parent)!r}, device, name={args.name!r})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
