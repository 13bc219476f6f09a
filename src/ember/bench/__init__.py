"""``ember bench``: the benchmark suite across the backends, ratios, saved runs, comparisons.

``registry`` lists the scripts of ``benchmarks/`` with their arguments and how to read
their tables; ``runner`` runs them (each in its own process) and collects the tables
they record; ``tables`` turns those into results with ratios to the reference;
``results`` is the JSON of a run; ``compare`` flags regressions between two runs;
``cli`` is the command.
"""

from ember.bench.compare import Comparison, compare_runs
from ember.bench.registry import SUITE, BenchmarkScript, Reading, register
from ember.bench.results import BenchFileError, BenchRun, Result, load_run, save_run
from ember.bench.runner import run_suite

__all__ = [
    "SUITE", "BenchFileError", "BenchRun", "BenchmarkScript", "Comparison", "Reading", "Result",
    "compare_runs", "load_run", "register", "run_suite", "save_run",
]  # fmt: skip
