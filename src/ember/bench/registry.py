"""The benchmark suite: each script under ``benchmarks/``, its arguments, and how to read it.

A script prints tables through ``benchmarks/timing.py``'s ``print_table``, which also
records them as JSON when ``ember bench`` asks (``EMBER_BENCH_RECORD``). A
:class:`Reading` says which columns of such a table hold the implementation, its time
and the case, and which implementation is the reference (PyTorch, or onnxruntime for
the ONNX models): ``ember bench`` turns the rows into ratios against it. Tables that no
reading fits (memory, accuracy, compile times, the kernel tables laid out one column per
library) are kept in the saved JSON as they are.

A new benchmark script joins the suite with :func:`register`. ``bench_conv_kernels.py``
and ``bench_pool_kernels.py`` print their own lines, not ``print_table``'s tables, so
they are not in the suite yet; ``record_bombs.py`` measures failures, not speed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ember.backend.errors import ArgumentError


@dataclass(frozen=True)
class Reading:
    """How to read timings out of one kind of recorded table.

    Args:
        impl: the header of the column that names the implementation.
        time: the header of the column with its time.
        unit: seconds per unit of the time column (``1e-3`` for milliseconds).
        reference: a regular expression matching the reference implementation's name;
            the first matching row of a case is its reference.
        case: headers of the columns that, with the table's title, name the case (those
            present in a table are used).
        label: appended to the case, to tell apart two readings of one table (``save``,
            ``load``).
    """

    impl: str
    time: str
    unit: float
    reference: str
    case: tuple[str, ...] = ()
    label: str = ""

    def __post_init__(self) -> None:
        try:
            re.compile(self.reference)
        except re.error as error:
            raise ArgumentError(f"Reading: bad reference pattern {self.reference!r}: {error}") \
                from error  # fmt: skip
        if not self.unit > 0:
            raise ArgumentError(f"Reading: unit must be positive seconds, got {self.unit!r}")


@dataclass(frozen=True)
class BenchmarkScript:
    """One script of the suite.

    Args:
        name: the name ``ember bench --filter`` matches.
        script: the file name under the benchmarks folder.
        args: the arguments ``ember bench`` runs it with (short runs: fewer repeats,
            smaller inputs where the script offers them).
        readings: how to read its tables into ratios (none: tables kept as they are).
        requires: modules that must be importable, else the script is skipped.
        quick: part of the default run; the others (long, or needing downloaded data)
            run with ``--all`` or when ``--filter`` names them.
    """

    name: str
    script: str
    args: tuple[str, ...] = ()
    readings: tuple[Reading, ...] = ()
    requires: tuple[str, ...] = ()
    quick: bool = True


MS = 1e-3

SUITE: dict[str, BenchmarkScript] = {}


def register(benchmark: BenchmarkScript) -> BenchmarkScript:
    """Adds ``benchmark`` to the suite (replacing one of the same name); returns it."""
    if not isinstance(benchmark, BenchmarkScript):
        raise ArgumentError(f"register: expected a BenchmarkScript, got {type(benchmark).__name__}")
    SUITE[benchmark.name] = benchmark
    return benchmark


for _benchmark in (
    BenchmarkScript("autodiff_step", "autodiff_step.py", ("--batch", "32", "--rounds", "5"),
                    (Reading("impl", "ms", MS, r"^torch autograd"),), ("torch",)),
    BenchmarkScript("nn_step", "nn_step.py", ("--rounds", "5"),
                    (Reading("impl", "ms", MS, r"^torch autograd \(cpu\)"),), ("torch",)),
    BenchmarkScript("rnn_step", "rnn_step.py", ("--repeat", "3"),
                    (Reading("impl", "ms", MS, r"^torch autograd \(cpu\)"),), ("torch",)),
    BenchmarkScript("higher_order", "higher_order.py", ("--threads", "1", "--rounds", "5"),
                    (Reading("impl", "wall ms", MS, r"^torch eager"),), ("torch",)),
    BenchmarkScript("foundation", "foundation.py", ("--quick",),
                    (Reading("impl", "ms", MS, r"^raw torch"),), ("torch",)),
    BenchmarkScript("fusion", "fusion.py", ("--threads", "1", "--rounds", "5"),
                    (Reading("impl", "ms", MS, r"^torch eager$", ("threads", "workload")),),
                    ("torch", "numba")),
    BenchmarkScript("onnx_inference", "onnx_inference.py", ("--rounds", "5"),
                    (Reading("runtime", "ms / forward", MS, r"^onnxruntime$", ("model", "input")),),
                    ("torch", "onnx", "onnxruntime")),
    BenchmarkScript("weights_import", "weights_import.py", ("--params", "5"),
                    (Reading("reader", "ms", MS, r"^torch\.load \(zip\)$"),),
                    ("torch", "safetensors")),
    BenchmarkScript("records", "records.py", ("--params", "5", "--skip-json"),
                    (Reading("format", "save s", 1.0, r"^torch\.save", label="save"),
                     Reading("format", "load s", 1.0, r"^torch\.save", label="load")),
                    ("torch", "safetensors")),
    BenchmarkScript("fusion_kernels", "fusion_kernels.py", ("--threads", "1", "--repeat", "3"),
                    (), ("torch", "numba")),
    BenchmarkScript("quantization", "quantization.py", ("--threads", "1"),
                    (Reading("side", "ms", MS, r"^torch int8 dynamic$", ("input",)),),
                    ("torch", "numba"), quick=False),  # MNIST for its accuracy table
    BenchmarkScript("guide_epoch", "guide_epoch.py", ("--iterations", "50"),
                    (Reading("side", "ms/iteration", MS, r"^PyTorch"),), ("torch",),
                    quick=False),  # MNIST
    BenchmarkScript("dataloader", "dataloader.py", ("--repeat", "3"),
                    (Reading("side", "median epoch", 1.0, r"^PyTorch"),), ("torch",), quick=False),
    BenchmarkScript("distributed", "distributed.py", ("--repeat", "3"), (), ("torch",),
                    quick=False),
    BenchmarkScript("matmul_kernels", "bench_matmul_kernels.py", (), (), ("torch", "numba"),
                    quick=False),
    BenchmarkScript("int8_kernels", "bench_int8_kernels.py", ("--threads", "1"), (),
                    ("torch", "numba"), quick=False),
):  # fmt: skip
    register(_benchmark)
