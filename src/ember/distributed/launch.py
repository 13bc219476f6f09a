"""``ember launch``: start a job of several processes on this machine (or one node of many).

    ember launch --nproc 2 train.py --epochs 3
    ember launch --nproc 2 -m ember guide train --backend ndarray

It is ``torchrun`` underneath (``torch.distributed.run``: its agent starts the processes,
sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``, and
watches them), so nothing new is installed and several machines are started the same way
with ``--nnodes``/``--node-rank``/``--master-addr`` or with ``torchrun`` itself. Each
process runs the script through :mod:`ember.distributed.worker`, which records an uncaught
error for the agent. When one process fails, the agent stops the others at once (none is
left waiting in a collective), and ``ember launch`` prints which rank failed, its exit
status and its error, and exits with status 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ember.cli import _at_least


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ember launch",
        description="Runs a script (or -m module) in --nproc processes that form one job.",
    )
    parser.add_argument("--nproc", type=_at_least(1), required=True, metavar="N",
                        help="processes on this machine (one per device)")  # fmt: skip
    parser.add_argument("--nnodes", type=_at_least(1), default=1, metavar="N",
                        help="machines taking part (default: 1)")  # fmt: skip
    parser.add_argument("--node-rank", type=int, default=0, metavar="I",
                        help="this machine's index among them (default: 0)")  # fmt: skip
    parser.add_argument("--master-addr", default="127.0.0.1", metavar="HOST",
                        help="the machine of node 0 (default: 127.0.0.1)")  # fmt: skip
    parser.add_argument("--master-port", type=int, default=29500, metavar="PORT",
                        help="its port (default: 29500; 0 on one machine picks a free one)")  # fmt: skip
    parser.add_argument("-m", dest="module", action="store_true",
                        help="run the target as a module (python -m)")  # fmt: skip
    parser.add_argument("target", help="the script (or module with -m)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the target's arguments")
    return parser


def main(argv: Sequence[str]) -> int:
    """Runs ``ember launch`` with ``argv``; 0 when every process succeeded."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if not args.module and not Path(args.target).is_file():
        parser.error(f"no script at {args.target!r} (use -m for a module)")
    if not 0 <= args.node_rank < args.nnodes:
        parser.error(f"--node-rank must be in [0, {args.nnodes}), got {args.node_rank}")
    if not 0 <= args.master_port < 65536:
        parser.error(f"--master-port must be in 0..65535, got {args.master_port}")
    try:
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import get_args_parser, run
    except ImportError:
        parser.exit(1, "ember launch: needs torch (pip install ember[torch])\n")

    torchrun = ["--nproc-per-node", str(args.nproc), "--nnodes", str(args.nnodes),
                "--node-rank", str(args.node_rank), "--master-addr", args.master_addr,
                "--master-port", str(args.master_port), "--max-restarts", "0"]  # fmt: skip
    if args.nnodes == 1 and args.master_port == 0:
        torchrun.append("--standalone")
    worker = ["--module", "ember.distributed.worker", "-m" if args.module else "--",
              args.target, *args.args]  # fmt: skip
    try:
        run(get_args_parser().parse_args(torchrun + worker))
    except ChildFailedError as failed:
        print(_report(failed.failures), file=sys.stderr)
        return 1
    return 0


_NO_ERROR = "(no error recorded)"


def _report(failures: dict) -> str:
    """Which rank failed first and why; ranks that only saw a peer go (their collective
    failed) are named after it, since the rank that stopped them is the cause."""

    def text(failure) -> str:
        message = failure.message
        if isinstance(message, dict):  # the error file's record
            message = message.get("message", message)
        return str(message).strip() or _NO_ERROR

    def stopped_by_peer(failure) -> bool:
        return text(failure).startswith("DistributedError") and "collective failed" in text(failure)

    def status(failure) -> str:
        # A rank that recorded its error may still be killed by the launcher (SIGTERM)
        # while it exits, once a peer it stopped has exited first: the signal is not its
        # failure, the recorded error is.
        code = failure.exitcode
        if code >= 0:
            return f"exit status {code}"
        if text(failure) == _NO_ERROR or text(failure).startswith("Signal "):  # torchrun's own
            return f"killed by signal {-code}"
        return f"its error, then signal {-code}"

    ranks = sorted(failures, key=lambda r: (stopped_by_peer(failures[r]), failures[r].timestamp))
    first, others = ranks[0], ranks[1:]
    lines = [f"ember launch: rank {first} failed ({status(failures[first])}): "
             f"{text(failures[first])}"]  # fmt: skip
    lines += [f"ember launch: rank {r} stopped too (exit status {failures[r].exitcode})" for r in others]
    return "\n".join(lines)
