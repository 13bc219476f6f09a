"""The ONNX tests' helpers and the per-op pass table of the node suite."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

_SUITE = "test_node_suite.py::test_node_case["


def pytest_runtest_logreport(report) -> None:
    if _SUITE not in report.nodeid or (report.when != "call" and report.outcome != "skipped"
                                         and report.outcome != "failed"):
        return
    if report.when == "teardown":
        return
    from onnx_node_cases import RESULTS, case_op

    case = report.nodeid.split(_SUITE, 1)[1].rstrip("]")
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    else:
        outcome = report.outcome
    RESULTS.setdefault(case_op(case), Counter())[outcome] += 1


def pytest_terminal_summary(terminalreporter) -> None:
    try:
        from onnx_node_cases import RESULTS
    except Exception:  # onnx missing: the suite skipped itself
        return
    ran = {op: c for op, c in RESULTS.items() if c["passed"] + c["failed"] + c["xfailed"] > 0}
    if not RESULTS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("ONNX node tests: pass rate per op")
    write(f"{'op':<28} {'passed':>7} {'failed':>7} {'xfail':>6} {'skipped':>8}  rate")
    for op in sorted(ran):
        c = ran[op]
        total = c["passed"] + c["failed"] + c["xfailed"] + c["xpassed"]
        rate = 100.0 * c["passed"] / total if total else 0.0
        write(f"{op:<28} {c['passed']:>7} {c['failed']:>7} {c['xfailed']:>6} "
              f"{c['skipped']:>8}  {rate:5.1f}%")
    totals = sum(RESULTS.values(), Counter())
    unsupported = len(RESULTS) - len(ran)
    write(f"total: {totals['passed']} passed, {totals['failed']} failed, {totals['xfailed']} "
          f"expected failures, {totals['skipped']} skipped ({len(ran)} ops run, {unsupported} ops "
          f"with every case skipped)")
