"""The ``ember onnx`` command: ``import MODEL --out DIR [--name NAME]``, ``coverage``, and
``export guide --artifact-dir DIR --out FILE`` (the guide's trained model as ONNX).

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
                                   "Python code plus weights; export ember models to ONNX.")  # fmt: skip
    commands = root.add_subparsers(dest="command", required=True)
    imp = commands.add_parser("import", help="write MODEL as a Python module and its weights")
    imp.add_argument("model", type=Path, help="the .onnx file")
    imp.add_argument("--out", type=Path, required=True, help="the directory to write into")
    imp.add_argument("--name", default="model", help="stem of the files written (default: model)")
    cov = commands.add_parser("coverage", help="print the table of supported ONNX ops")
    cov.add_argument("--out", type=Path, default=None, help="write the table to this file")
    exp = commands.add_parser("export", help="write a saved ember model as an ONNX file")
    exp.add_argument("model", choices=("guide",), help="which saved model: the guide's "
                     "trained digit classifier (ember guide train)")  # fmt: skip
    exp.add_argument("--artifact-dir", type=Path, required=True, help="the training run's "
                     "artifact folder (config.json and the model record)")  # fmt: skip
    exp.add_argument("--out", type=Path, required=True, help="the .onnx file to write")
    exp.add_argument("--opset", type=int, default=17, help="the ONNX opset (default: 17)")
    exp.add_argument("--static-batch", action="store_true", help="fix the batch size at 1 "
                     "instead of a dynamic batch axis")  # fmt: skip
    return root


def export_guide(artifact_dir: Path, out: Path, opset: int, dynamic_batch: bool) -> Path:
    """The guide's trained model as ONNX: input ``images`` ``[batch, 28, 28]`` (pixels
    normalized as the guide's batcher does), output ``logits`` ``[batch, 10]``."""
    import ember
    from ember.guide.inference import load_trained
    from ember.onnx.export import export
    from ember.tensor import Tensor

    device = ember.device("ndarray")
    _config, model = load_trained(artifact_dir, device)
    axes = {"images": {0: "batch"}, "logits": {0: "batch"}} if dynamic_batch else None
    return export(model, Tensor.zeros([1, 28, 28], device), out, dynamic_axes=axes,
                  opset=opset, input_names=["images"], output_names=["logits"])  # fmt: skip


def printable(text: str) -> str:
    """``text`` with every character that is not printable (newlines, escape sequences,
    unicode line separators) written as a Python escape (``\\n``, ``\\x1b``)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``ember onnx`` with ``argv`` (the arguments after ``onnx``); returns the exit status."""
    args = parser().parse_args(argv)
    if args.command == "export":
        try:
            path = export_guide(args.artifact_dir, args.out, args.opset, not args.static_batch)
        except EmberError as error:
            print(f"ember onnx export: {printable(str(error))}", file=sys.stderr)
            return 1
        print(printable(f"wrote {path} (input 'images' [batch, 28, 28], output 'logits' "
                        f"[batch, 10])"))  # fmt: skip
        return 0
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
