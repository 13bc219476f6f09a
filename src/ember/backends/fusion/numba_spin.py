"""Waiting for a counter to change without the GIL and without sleeping: the runtime's
worker threads spin here for a short while after each part they ran.

A worker that sleeps in a system call between two launches wakes 25-150 us after the next
launch posts its job on a virtual machine whose idle vCPU halts (measured on a 2-vCPU KVM
guest: 25-30 us after a busy spell, 46 us after 1 ms idle, ~150 us after 5 ms), and by
then the caller has run most of the parts itself. A model's forward launches a kernel
every few hundred microseconds, so a worker that keeps checking the launch counter for
:func:`spin_seconds` after its part is there for the next one. The check is a numba
``nogil`` loop over an atomic load (a Python loop would hold the GIL the recording thread
needs) with the CPU's pause hint between loads.

``EMBER_FUSION_SPIN_US`` sets how long (microseconds; 0: always sleep at once).
"""

from __future__ import annotations

import platform
import time

from ember.backend.environment import whole_number

try:  # numba is optional: numba_runtime checks it before starting workers
    import numba
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

__all__ = ["report_and_wait", "rounds_for", "spin_seconds", "wait_for_change", "wait_until"]

DEFAULT_SPIN_US = 300


def spin_seconds() -> float:
    """How long a worker spins after its part: ``EMBER_FUSION_SPIN_US`` or the default.

    Raises:
        ConfigError: the variable is not a whole number of microseconds of at least 0.
    """
    return whole_number("EMBER_FUSION_SPIN_US", DEFAULT_SPIN_US, "microseconds",
                        "0 sleeps at once") * 1e-6


if numba is not None:
    _X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")

    @intrinsic
    def _load_acquire(typingctx, address):
        """The int64 at ``address``, loaded atomically (never hoisted out of a loop)."""
        sig = types.int64(types.uintp)

        def codegen(context, builder, signature, args):
            pointer = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
            return builder.load_atomic(pointer, "acquire", 8)

        return sig, codegen

    @intrinsic
    def _pause(typingctx):
        """The CPU's spin-wait hint (x86 ``pause``); nothing elsewhere."""
        sig = types.void()

        def codegen(context, builder, signature, args):
            if _X86:
                hint = builder.module.declare_intrinsic(
                    "llvm.x86.sse2.pause", (), ir.FunctionType(ir.VoidType(), [])
                )
                builder.call(hint, [])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def _add(typingctx, address, value):
        """Adds ``value`` to the int64 at ``address`` atomically."""
        sig = types.void(types.uintp, types.int64)

        def codegen(context, builder, signature, args):
            pointer = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
            builder.atomic_rmw("add", pointer, args[1], "acq_rel")
            return context.get_dummy_value()

        return sig, codegen

    @numba.njit(nogil=True, cache=True)
    def wait_for_change(address, seen, rounds):
        """Whether the int64 at ``address`` differs from ``seen`` within ``rounds`` checks."""
        for _ in range(rounds):
            if _load_acquire(address) != seen:
                return True
            _pause()
        return _load_acquire(address) != seen

    @numba.njit(nogil=True, cache=True)
    def report_and_wait(report, count, address, seen, rounds, linger):
        """Adds ``count`` to the int64 at ``report``, then :func:`wait_for_change`, and
        after a change waits ``linger`` rounds more. The addition happens without the GIL,
        so whoever waits for it (:func:`wait_until`) finds the GIL free once it sees it;
        the lingering gives whoever made the change the moment it needs to let the GIL go
        (a thread that finds the GIL taken sleeps, and wakes late)."""
        if count:
            _add(report, count)
        if not wait_for_change(address, seen, rounds):
            return False
        for _ in range(linger):
            _pause()
        return True

    @numba.njit(nogil=True, cache=True)
    def wait_until(address, target, rounds):
        """Whether the int64 at ``address`` reaches ``target`` within ``rounds`` checks."""
        for _ in range(rounds):
            if _load_acquire(address) >= target:
                return True
            _pause()
        return _load_acquire(address) >= target


def rounds_for(seconds: float, address: int, seen: int) -> int:
    """The rounds of :func:`wait_for_change` that take about ``seconds`` on this machine
    (``address`` must hold ``seen`` while it is measured)."""
    if seconds <= 0:
        return 0
    wait_for_change(address, seen, 1)  # compiled or loaded from numba's cache first
    trial = 20_000
    started = time.perf_counter()
    wait_for_change(address, seen, trial)
    per_round = max(time.perf_counter() - started, 1e-6) / trial
    return max(1, int(seconds / per_round))
