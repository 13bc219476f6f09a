"""Runs the test suite as N pytest processes side by side, one shard each (tests/sharding.py).

Usage: ``python scripts/run_shards.py N [pytest arguments...]``

The first shard's output is shown as it runs; the others' follow when they end. The exit
status is the first failing shard's (a shard that got no test, status 5, counts as
passed). The shards share one folder of compiled fusion kernels, as one process would.
Ctrl-C reaches every shard (they are in this process's group).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

NO_TESTS_COLLECTED = 5


def main() -> int:
    count, args = int(sys.argv[1]), sys.argv[2:]
    pytest = [sys.executable, "-m", "pytest", "-q"]
    with tempfile.TemporaryDirectory(prefix="ember-shards-") as folder:
        env = dict(os.environ)
        env.setdefault("EMBER_FUSION_CACHE", str(Path(folder) / "fusion-kernels"))
        logs = [Path(folder) / f"shard{k}.log" for k in range(2, count + 1)]
        others = []
        for k, log in zip(range(2, count + 1), logs):
            with open(log, "wb") as out:
                others.append(subprocess.Popen([*pytest, "--shard", f"{k}/{count}", *args],
                                               stdout=out, stderr=subprocess.STDOUT, env=env))  # fmt: skip
        codes = [subprocess.call([*pytest, "--shard", f"1/{count}", *args], env=env)]
        for k, (process, log) in enumerate(zip(others, logs), start=2):
            codes.append(process.wait())
            print(f"\n{'=' * 20} shard {k}/{count} {'=' * 20}", flush=True)
            sys.stdout.buffer.write(log.read_bytes())
            sys.stdout.flush()
    failed = [code for code in codes if code not in (0, NO_TESTS_COLLECTED)]
    if failed:
        return failed[0]
    return NO_TESTS_COLLECTED if all(code == NO_TESTS_COLLECTED for code in codes) else 0


if __name__ == "__main__":
    sys.exit(main())
