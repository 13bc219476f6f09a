"""Runs the test suite as N pytest processes side by side, one shard each (tests/sharding.py).

Usage: ``python scripts/run_shards.py N [--update-durations] [pytest arguments...]``

The first shard's output is shown as it runs; the others' follow when they end. The exit
status is the first failing shard's (a shard that got no test, status 5, counts as
passed). The shards share one folder of compiled fusion kernels, as one process would.
Ctrl-C reaches every shard (they are in this process's group).

``--update-durations`` rewrites ``tests/durations.json``, the seconds per file that the
shards are balanced by, from this run's, where every shard passed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

NO_TESTS_COLLECTED = 5
TESTS = Path(__file__).resolve().parents[1] / "tests"


def main() -> int:
    count, args = int(sys.argv[1]), sys.argv[2:]
    update = "--update-durations" in args
    args = [arg for arg in args if arg != "--update-durations"]
    pytest = [sys.executable, "-m", "pytest", "-q"]
    with tempfile.TemporaryDirectory(prefix="ember-shards-") as folder:
        env = dict(os.environ)
        env.setdefault("EMBER_FUSION_CACHE", str(Path(folder) / "fusion-kernels"))
        tables = [Path(folder) / f"shard{k}.json" for k in range(1, count + 1)]

        def command(k: int) -> list[str]:
            timing = ["--durations-out", str(tables[k - 1])] if update else []
            return [*pytest, "--shard", f"{k}/{count}", *timing, *args]

        logs = [Path(folder) / f"shard{k}.log" for k in range(2, count + 1)]
        others = []
        for k, log in zip(range(2, count + 1), logs):
            with open(log, "wb") as out:
                others.append(subprocess.Popen(command(k), stdout=out, stderr=subprocess.STDOUT,
                                               env=env))  # fmt: skip
        codes = [subprocess.call(command(1), env=env)]
        for k, (process, log) in enumerate(zip(others, logs), start=2):
            codes.append(process.wait())
            print(f"\n{'=' * 20} shard {k}/{count} {'=' * 20}", flush=True)
            sys.stdout.buffer.write(log.read_bytes())
            sys.stdout.flush()
        failed = [code for code in codes if code not in (0, NO_TESTS_COLLECTED)]
        if update and not failed:
            _write_durations(tables)
    if failed:
        return failed[0]
    return NO_TESTS_COLLECTED if all(code == NO_TESTS_COLLECTED for code in codes) else 0


def _write_durations(tables: list[Path]) -> None:
    sys.path.insert(0, str(TESTS))
    from ember.atomic import atomic_write
    from sharding import DURATIONS, merge_durations

    merged = merge_durations([json.loads(table.read_text()) for table in tables if table.exists()])
    atomic_write(DURATIONS, (json.dumps(merged, indent=1) + "\n").encode())
    print(f"{DURATIONS}: {len(merged)} files, {sum(merged.values()):.0f} s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
