"""One process of a job started by ``ember launch``: runs the user's script or module.

``python -m ember.distributed.worker -- script.py args`` (or ``-m module args``) runs the
target as ``python script.py args`` would, inside torch's ``record`` so that an uncaught
error reaches the launcher's agent with its message and traceback (``launch.py``).
"""

from __future__ import annotations

import runpy
import sys


def main() -> None:
    from torch.distributed.elastic.multiprocessing.errors import record

    args = sys.argv[1:]
    as_module = args[:1] == ["-m"]
    if args[:1] in (["-m"], ["--"]):
        args = args[1:]
    target, rest = args[0], args[1:]

    @record
    def run() -> None:
        sys.argv = [target, *rest]
        if as_module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")

    run()


if __name__ == "__main__":
    main()
