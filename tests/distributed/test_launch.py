"""``ember launch``: a job of two processes runs; a failing rank stops the job and is named."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from harness import run_job

pytest.importorskip("torch.distributed")


def _launch(tmp_path: Path, script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(script))
    return subprocess.run(
        [sys.executable, "-m", "ember", "launch", "--nproc", "2", "--master-port", "0",
         str(path), *args],
        capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
    )  # fmt: skip


def test_two_processes_form_one_job(tmp_path):
    done = _launch(tmp_path, """
        import sys, ember, ember.distributed as dist
        dist.init()
        total = dist.all_reduce(ember.Tensor.from_data([float(dist.rank() + 1)]))
        open(f"{sys.argv[1]}.{dist.rank()}", "w").write(f"{total.tolist()} {dist.world_size()}")
        dist.shutdown()
    """, "result")
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(2):
        assert (tmp_path / f"result.{rank}").read_text() == "[3.0] 2"


def test_a_failing_rank_stops_the_job_and_is_named(tmp_path):
    started = time.monotonic()
    done = _launch(tmp_path, """
        import ember, ember.distributed as dist
        dist.init()
        if dist.rank() == 1:
            raise ValueError("boom from rank 1")
        dist.all_reduce(ember.Tensor.from_data([1.0]))  # rank 0 waits here for rank 1
    """)
    assert done.returncode == 1
    # Rank 1 exits with status 1, unless the launcher's SIGTERM (sent when rank 0, stopped
    # by rank 1's exit, exits first) reaches it while it exits: either way it is named.
    assert re.search(r"ember launch: rank 1 failed \((exit status 1|its error, then signal 15)\): "
                     r"ValueError: boom from rank 1", done.stderr), done.stderr[-2000:]
    # Stopped by the launcher, long before the collective's timeout (EMBER_DIST_TIMEOUT, 300 s).
    assert time.monotonic() - started < 100


def test_without_a_launcher_the_waiting_rank_names_the_failed_one(tmp_path):
    results = run_job(2, "raising", tmp_path)
    assert results[1].returncode == 1 and "ValueError: boom from rank 1" in results[1].output
    assert results[0].returncode == 0  # it caught the typed error
    error = json.loads((tmp_path / "rank0.json").read_text())["error"]
    assert error.startswith("DistributedError: ember.distributed.all_reduce: rank 0: the "
                            "collective failed (rank 1 failed: ValueError: boom from rank 1)")  # fmt: skip


def test_a_killed_rank_stops_the_job(tmp_path):
    done = _launch(tmp_path, """
        import os, signal, ember, ember.distributed as dist
        dist.init()
        if dist.rank() == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(ember.Tensor.from_data([1.0]))
    """)
    assert done.returncode == 1
    assert "ember launch: rank 0 failed (killed by signal 9)" in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nproc", "0", "x.py"], "argument --nproc: expected an integer >= 1, got '0'"),
        (["--nproc", "2", "missing.py"], "no script at 'missing.py' (use -m for a module)"),
        (["--nproc", "2", "--nnodes", "2", "--node-rank", "2", "job.py"],
         "--node-rank must be in [0, 2), got 2"),
        (["--nproc", "2", "--master-port", "70000", "job.py"],
         "--master-port must be in 0..65535, got 70000"),
    ],
)  # fmt: skip
def test_bad_arguments_exit_with_status_2(tmp_path, args, message):
    (tmp_path / "job.py").write_text("pass\n")
    done = subprocess.run([sys.executable, "-m", "ember", "launch", *args],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2
    assert message in done.stderr
