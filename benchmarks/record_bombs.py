"""Loading 4 GB gzip bombs in every compressed record format: how fast each fails, and the
peak memory it costs.

Run: ``.venv/bin/python benchmarks/record_bombs.py [--gb 4] [--max-bytes N]``

Each bomb (see ``tests/record/record_bombs.py``) is ~4 MB of gzip holding 4 GB of zeros
(or ``0,0,...`` / spaces for JSON), either as a record that declares a 4 GB tensor, as a
small valid record followed by the zeros, or as zeros alone. Each is loaded in a fresh
interpreter, at the default content limit unless ``--max-bytes`` is given; the table
shows the error, the seconds to it and how much the peak resident memory grew.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "record"))
from record_bombs import BOMBS, measure
from timing import print_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gb", type=float, default=4.0, help="inflated size of each bomb")
    parser.add_argument("--max-bytes", type=int, default=None, help="the recorders' limit")
    args = parser.parse_args()
    nbytes = min(int(args.gb * 1e9), 2**32 - 1)  # a MessagePack bin holds < 4 GiB
    folder = Path(tempfile.mkdtemp())
    rows = []
    for kind, builders in BOMBS.items():
        for build in builders:
            path = folder / f"{build.__name__}.{kind}"
            path.write_bytes(build(nbytes))
            result = measure(path, kind, args.max_bytes)
            rows.append([kind, build.__name__, f"{path.stat().st_size / 1e6:.1f}",
                         result["error"] or "loaded", f"{result['seconds']:.2f}",
                         f"{result['peak_growth'] / 1e6:.0f}", result["message"][-70:]])
            path.unlink()
    print_table(f"gzip bombs of {nbytes / 1e9:.1f} GB", ["format", "bomb", "file MB", "outcome",
                "seconds", "peak MB", "message (end)"], rows)  # fmt: skip


if __name__ == "__main__":
    main()
