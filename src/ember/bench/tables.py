"""From recorded tables to results: each row's time, and its ratio to the reference.

A :class:`~ember.bench.registry.Reading` names the columns; the rows of a table are
grouped by case (the title, the case columns, the reading's label), and each case's
first row whose implementation matches the reference pattern is the reference of the
others. A cell that is not a positive finite number (``nan`` for a case a library
cannot run, an empty cell) gives no result.
"""

from __future__ import annotations

import math
import re

from ember.bench.registry import BenchmarkScript, Reading
from ember.bench.results import Result, Table


def read_results(benchmark: BenchmarkScript, tables: list[Table]) -> list[Result]:
    """The results of ``benchmark``'s tables, by each of its readings that fits a table."""
    results: list[Result] = []
    for table in tables:
        for reading in benchmark.readings:
            results += _read(benchmark.name, reading, table)
    return results


def backend_of(impl: str) -> str | None:
    """The ember backend an implementation's name runs on (None: not ember's).

    Example:
        >>> [backend_of(n) for n in ("ember autodiff(fusion(ndarray))", "ember/torch",
        ...                          "torch autograd", "ember int8 (NdArray)", "ember read_pytorch")]
        ['fusion', 'torch', None, 'ndarray', None]
    """
    name = impl.lower()
    if re.search(r"\bfusion\b", name):
        return "fusion"
    if name.startswith("ember") or name == "ndarray":
        for backend in ("ndarray", "torch"):
            if re.search(rf"\b{backend}\b", name):  # "read_pytorch" is not the torch backend
                return backend
    return None


def _read(benchmark: str, reading: Reading, table: Table) -> list[Result]:
    header = table.header
    if reading.impl not in header or reading.time not in header:
        return []
    impl_at, time_at = header.index(reading.impl), header.index(reading.time)
    case_at = [header.index(c) for c in reading.case if c in header]
    reference = re.compile(reading.reference)
    cases: dict[str, list[tuple[str, float]]] = {}
    for row in table.rows:
        if len(row) != len(header):
            continue
        seconds = _number(row[time_at])
        if seconds is None:
            continue
        case = " · ".join(p for p in (table.title, *(row[i] for i in case_at), reading.label) if p)
        cases.setdefault(case, []).append((row[impl_at], seconds * reading.unit))
    results = []
    for case, timings in cases.items():
        found = [(impl, s) for impl, s in timings if reference.search(impl)]
        ref_impl, ref_seconds = found[0] if found else (None, None)
        for impl, seconds in timings:
            results.append(Result(
                benchmark=benchmark, case=case, impl=impl, backend=backend_of(impl),
                seconds=seconds, reference=ref_impl, reference_seconds=ref_seconds,
            ))  # fmt: skip
    return results


def _number(cell: str) -> float | None:
    try:
        value = float(cell.strip().replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None
