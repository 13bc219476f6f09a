"""Runs a job of several processes on localhost, as ``torchrun`` would, for the tests.

``run_job(world_size, job, out_dir)`` starts ``world_size`` Python processes, each running
``jobs.py <job> <out_dir>`` (forked from a process that has torch imported: see
``_ranks``) with the standard variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) set, waits for all of them (killing the
rest at the timeout) and returns each rank's exit status and output. Ranks write what the
test compares into ``out_dir`` (``rank<r>.npz``, ``rank<r>.json``).
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing
import os
import runpy
import socket
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
        log = out_dir / f"rank{rank}.log"
        log.touch()
        rank_env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
        proc = _ranks().Process(target=_rank_main, args=(job, str(out_dir), args, rank_env, str(log)))
        proc.start()
        procs.append((proc, log))
    deadline = time.monotonic() + timeout
    results = []
    for rank, (proc, log) in enumerate(procs):
        proc.join(max(0.1, deadline - time.monotonic()))
        code = proc.exitcode
        if code is None:
            proc.kill()
            proc.join()
        results.append(RankResult(rank, code, log.read_text(errors="replace")))
    return results


@functools.cache
def _ranks():
    """Where ranks are forked from: a server process that imported torch once.

    Importing torch takes about 3 s of a core, and the suite starts some thirty ranks; each
    forked rank starts with torch (and NumPy) already imported, but nothing of ember, whose
    settings come from the rank's own environment.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["numpy", "torch.distributed"])
    return context


def _rank_main(job: str, out_dir: str, args: tuple[str, ...], env: dict[str, str], log: str) -> None:
    """One rank in a forked process: ``python jobs.py <job> <out_dir> [args]`` with ``env``
    as its whole environment and its output in ``log``."""
    os.environ.clear()
    os.environ.update(env)
    output = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(output, 1)
    os.dup2(output, 2)
    import torch

    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    sys.argv = [str(JOBS), job, out_dir, *args]
    # Ends as the interpreter would end the script: an uncaught error goes to sys.excepthook
    # (ember.distributed tells the other ranks through it) and the atexit handlers run.
    status = 0
    try:
        runpy.run_path(str(JOBS), run_name="__main__")
    except SystemExit as stop:
        status = stop.code
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    atexit._run_exitfuncs()
    sys.exit(status)


def check_ok(results: list[RankResult]) -> None:
    bad = [r for r in results if r.returncode != 0]
    assert not bad, "\n".join(f"rank {r.rank} exited {r.returncode}:\n{r.output[-3000:]}" for r in bad)
