"""``ember bench``: run the benchmark suite, print ratios to the reference, save, compare.

Usage::

    ember bench [--filter PATTERN] [--all] [--backends ndarray,fusion,torch] [--threads N]
                [--save RUN.json] [--dir BENCHMARKS] [--timeout S] [--list]
    ember bench compare OLD.json NEW.json [--threshold 1.10] [--metric seconds|ratio]

The first form runs the scripts of the suite (:mod:`ember.bench.registry`) found under
``--dir`` (default: ``./benchmarks``, else the source checkout's), prints one table (a
row per benchmark case and implementation: its time and its ratio to the reference,
PyTorch unless the row says otherwise) and saves the run as JSON. ``compare`` prints the
changes between two saved runs and exits with status 1 when a result got slower than
``--threshold`` times, so a CI job can gate on it.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import ember
from ember.backend.errors import ArgumentError, EmberError
from ember.bench.compare import compare_runs
from ember.bench.registry import SUITE, BenchmarkScript
from ember.bench.results import BenchRun, ScriptRun, load_run, save_run
from ember.bench.runner import run_suite

BACKENDS = ("ndarray", "fusion", "torch")


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``ember bench`` with ``argv``; returns the exit status (see the module doc)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    compare = arguments[:1] == ["compare"]
    parser = _compare_parser() if compare else _run_parser()
    args = parser.parse_args(arguments[1:] if compare else arguments)
    try:
        return _compare(args) if compare else _run(args)
    except EmberError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    return 1  # unreachable: parser.exit raises


# ---------------------------------------------------------------------- ember bench
def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ember bench",
        description="Run the benchmark suite across the backends available; print each "
        "result's ratio to the reference (PyTorch) and save the run as JSON. "
        "'ember bench compare OLD.json NEW.json' compares two saved runs.",
    )
    parser.add_argument("--filter", metavar="PATTERN",
                        help="run the benchmarks whose name matches this regular expression "
                        "(long ones included)")  # fmt: skip
    parser.add_argument("--all", action="store_true",
                        help="also run the long benchmarks and those that need downloaded data")
    parser.add_argument("--backends", metavar="LIST", type=_backends,
                        help=f"show only these ember backends (comma separated: "
                        f"{', '.join(BACKENDS)}); rows of other libraries (PyTorch, "
                        "onnxruntime) stay")  # fmt: skip
    parser.add_argument("--threads", type=_positive_int, default=1, metavar="N",
                        help="threads for NumPy, torch and fused kernels (default: 1)")
    parser.add_argument("--save", type=Path, metavar="PATH",
                        help="where to save the run (default: ember-bench-<time>.json here)")
    parser.add_argument("--dir", type=Path, metavar="DIR",
                        help="the benchmarks folder (default: ./benchmarks, else the checkout's)")
    parser.add_argument("--timeout", type=float, default=1800.0, metavar="S",
                        help="seconds one script may run (default: 1800)")
    parser.add_argument("--list", action="store_true", help="list the suite and exit")
    return parser


def _run(args: argparse.Namespace) -> int:
    chosen = _select(args.filter, args.all)
    if args.list:
        for benchmark in SUITE.values():
            mark = "*" if benchmark in chosen else " "
            print(f"{mark} {benchmark.name:<16} {benchmark.script} {' '.join(benchmark.args)}")
        print("(* would run with these options)")
        return 0
    if not chosen:
        raise ArgumentError(f"no benchmark matches {args.filter!r}; see ember bench --list")
    directory = _benchmarks_dir(args.dir)
    print(f"backends available: {', '.join(available_backends())}; threads {args.threads}; "
          f"scripts from {directory}")  # fmt: skip
    run = run_suite(chosen, directory, args.threads, args.timeout,
                    on_start=lambda b: print(f"running {b.name} ...", flush=True),
                    on_done=_report_script)  # fmt: skip
    print()
    print(format_results(run, args.backends))
    path = args.save or Path(f"ember-bench-{datetime.datetime.now():%Y%m%d-%H%M%S}.json")
    save_run(run, path)
    print(f"\nsaved {path}")
    return 0


def available_backends() -> list[str]:
    """ember's backends this machine can run (torch and numba are optional)."""
    found = ["ndarray"]
    if importlib.util.find_spec("numba") is not None:
        found.append("fusion")
    if importlib.util.find_spec("torch") is not None:
        found.append("torch")
    return found


def format_results(run: BenchRun, backends: set[str] | None = None) -> str:
    """The run's results as one table: time and ratio to the reference per row."""
    header = ["benchmark", "case", "impl", "backend", "ms", "vs reference"]
    rows = []
    for result in run.results:
        if backends is not None and result.backend is not None and result.backend not in backends:
            continue
        ratio = result.ratio
        versus = "" if ratio is None else f"{ratio:.2f}x {result.reference}"
        if result.impl == result.reference:
            versus = "(reference)"
        rows.append([result.benchmark, _cut(result.case, 70), result.impl,
                     result.backend or "-", f"{result.seconds * 1e3:.3f}", versus])  # fmt: skip
    if not rows:
        return "(no results: see the scripts' status above)"
    return _table(header, rows)


def _report_script(outcome: ScriptRun) -> None:
    if outcome.status == "ok":
        print(f"  ok, {len(outcome.tables)} table(s) in {outcome.wall_seconds:.1f} s")
    else:
        print(f"  {outcome.status}: {outcome.reason}")


def _select(pattern: str | None, everything: bool) -> list[BenchmarkScript]:
    if pattern is None:
        return [b for b in SUITE.values() if b.quick or everything]
    try:
        matcher = re.compile(pattern)
    except re.error as error:
        raise ArgumentError(f"--filter: bad regular expression {pattern!r}: {error}") from error
    return [b for b in SUITE.values() if matcher.search(b.name)]


def _benchmarks_dir(given: Path | None) -> Path:
    if given is not None:
        if not given.is_dir():
            raise ArgumentError(f"--dir: {given} is not a folder")
        return given.resolve()
    for candidate in (Path.cwd() / "benchmarks",
                      Path(ember.__file__).resolve().parents[2] / "benchmarks"):  # fmt: skip
        if (candidate / "timing.py").is_file():
            return candidate
    raise ArgumentError(
        "no benchmarks folder here (./benchmarks) nor in ember's source checkout; the "
        "scripts come with the repository: run from a checkout or pass --dir"
    )


# ---------------------------------------------------------------------- ember bench compare
def _compare_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ember bench compare",
        description="Compare two saved runs; exit status 1 when a result got slower than the "
        "threshold.",
    )
    parser.add_argument("old", type=Path, help="the earlier run (JSON from ember bench)")
    parser.add_argument("new", type=Path, help="the later run")
    parser.add_argument("--threshold", type=_factor, default=1.10, metavar="X",
                        help="a change above X times is a regression (default: 1.10)")
    parser.add_argument("--metric", choices=("seconds", "ratio"), default="seconds",
                        help="compare the times (default) or the ratios to the reference, "
                        "which cancel a machine that is faster overall")  # fmt: skip
    return parser


def _compare(args: argparse.Namespace) -> int:
    old, new = load_run(args.old), load_run(args.new)
    result = compare_runs(old, new, args.threshold, args.metric)
    unit = "ms" if args.metric == "seconds" else "x ref"
    scale = 1e3 if args.metric == "seconds" else 1.0
    flagged = {id(c): "REGRESSION" for c in result.regressions}
    flagged.update({id(c): "improved" for c in result.improvements})
    rows = [[*c.key[:1], _cut(c.key[1], 70), c.key[2], f"{c.old * scale:.3f}",
             f"{c.new * scale:.3f}", f"{c.factor:.2f}x", flagged.get(id(c), "")]
            for c in result.changes]  # fmt: skip
    header = ["benchmark", "case", "impl", f"old {unit}", f"new {unit}", "change", ""]
    print(_table(header, rows) if rows else "(no result in both runs)")
    if result.only_old or result.only_new:
        print(f"\n{len(result.only_old)} result(s) only in {args.old}, "
              f"{len(result.only_new)} only in {args.new}")  # fmt: skip
    print(f"\n{len(result.regressions)} regression(s) above {args.threshold:g}x, "
          f"{len(result.improvements)} improvement(s)")  # fmt: skip
    return 1 if result.regressions else 0


# ---------------------------------------------------------------------- helpers
def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
                     for r in [header, *rows])  # fmt: skip


def _cut(text: str, width: int) -> str:
    """``text`` shortened in the middle: a case's title starts it, what tells rows apart
    (the case columns) ends it."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def _backends(text: str) -> set[str]:
    names = {n.strip() for n in text.split(",") if n.strip()}
    unknown = names - set(BACKENDS)
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected backends among {', '.join(BACKENDS)}, got {text!r}"
        )
    return names


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def _factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 1 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number above 1, got {text!r}")
    return value
