"""Runs a job of several processes on localhost, as ``torchrun`` would, for the tests.

``run_job(world_size, job, out_dir)`` starts ``world_size`` Python processes, each running
``jobs.py <job> <out_dir>`` with the standard variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) set, waits for all of them (killing the
rest at the timeout) and returns each rank's exit status and output. Ranks write what the
test compares into ``out_dir`` (``rank<r>.npz``, ``rank<r>.json``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

JOBS = Path(__file__).with_name("jobs.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RankResult:
    rank: int
    returncode: int | None  # None: killed at the timeout
    output: str


def run_job(world_size: int, job: str, out_dir: Path, timeout: float = 120.0,
            env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> list[RankResult]:  # fmt: skip
    port = free_port()
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1", EMBER_DIST_TIMEOUT="30",
                **(env or {}))  # fmt: skip
    procs = []
    for rank in range(world_size):
        log = open(out_dir / f"rank{rank}.log", "w+")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [sys.executable, str(JOBS), job, str(out_dir), *args],
            env=dict(base, RANK=str(rank), LOCAL_RANK=str(rank)),
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        procs.append((proc, log))
    deadline = time.monotonic() + timeout
    results = []
    for rank, (proc, log) in enumerate(procs):
        try:
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = None
        log.seek(0)
        results.append(RankResult(rank, code, log.read()))
        log.close()
    return results


def check_ok(results: list[RankResult]) -> None:
    bad = [r for r in results if r.returncode != 0]
    assert not bad, "\n".join(f"rank {r.rank} exited {r.returncode}:\n{r.output[-3000:]}" for r in bad)
