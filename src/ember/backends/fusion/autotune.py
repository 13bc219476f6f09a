"""Kernel selection: how each fused block runs, timed on first use and remembered on disk.

A fused block can run as the runtime's kernel at any thread count, or as its records
one by one on the inner backend (unfused). Which is fastest depends on the block's ops,
its size and the machine: waking a second thread costs tens of microseconds (milliseconds
on a loaded machine), and a block of a few cheap ops may run as fast through NumPy's own
loops. So the first time a block of a given kind and size bucket runs, the :class:`Tuner`
times each candidate a few times (after the run whose outputs the caller keeps), keeps
the fastest (see :func:`_score`) and writes the choice to a file of the kernel cache
folder, which later processes read instead of timing again.

**What a choice is keyed by.** The block's :meth:`~ember.backends.fusion.ir.Block.key`
(its ops, dtypes, ranks and broadcast pattern: what one compiled kernel covers) and a
size bucket: the power of two of the block's element count, plus, for a block with a
reduction, the power of two of the reduced axis's length. A memory-bound kernel's time
grows with its element count while a thread's wake-up cost is fixed, so where more
threads start to pay is a matter of element count; the kernel of a reduction divides the
positions outside the axis among threads, so its axis length changes that point too.
Coarser buckets would tune fewer times but mix sizes where the winner changes; per-dim
buckets would time again for every batch size. The runtime's thread limit is part of the
key too, and the file is one per machine kind (processor architecture, CPU count, and the
CPU model and vector width numba compiles for, in its name and checked inside), so a
choice made on another machine never applies.
A fused block's key covers the kernel generator's source (the runtime's version); a
single op's (``op_kernels``: convolutions, pooling, products) covers the sources of those
kernels (:data:`OP_KERNEL_FILES`), so an edited kernel is timed again rather than left
unchosen by a choice settled against its older self.

**Cost.** Blocks under ``PARALLEL_MIN`` elements (the numba runtime's one-thread limit)
are not tuned: they run on one thread and their per-step cost stays a size check; nor
are those over :data:`MAX_ELEMENTS` (the runtime's own thread count, no timing). Nor are
a block or a single op timed at thread counts that twice as many threads surely beat
(:data:`MAX_TUNED_ELEMENTS`, :data:`MAX_TUNED_WORK`). A tuning times the fused candidates
first and the unfused ops after them (see ``_time``): each candidate twice (once where
that costs over :data:`MAX_TUNING_SECONDS`), dropping those whose best run is twice the
best of all, then the others in at most :data:`MAX_ROUNDS` rounds within about
:data:`BUDGET_SECONDS` (at least :data:`MIN_ROUNDS` while those cost under
:data:`MAX_TUNING_SECONDS`): a few ms for a block of a few hundred thousand elements on an
idle machine, more where a candidate itself takes longer. A bucket is tuned at most
:data:`SETTLED_AFTER` times per cache folder and machine kind (see "Settling").

**Settling.** One tuning is a few runs of each candidate, and a busy host (another
process on the second core for a moment) can make the wrong one win; written to disk, such
a choice stayed for good (two-thread convolutions of an imported CNN left on NdArray's
im2col by old choices: 23 ms a forward against 15 with fresh ones). So a choice is written
with how many tunings made it (``tunings``) and how many of the last ones in a row agreed
(``streak``), and a later process tunes the bucket again, once, until two tunings in a row
agree or :data:`SETTLED_AFTER` tunings were made (the last one is kept). A settled choice
is used without timing. Within one process a bucket is tuned once, unless other
processes' threads were running on the machine while it was timed (:func:`others_running`,
sampled before and after the timing, at least :data:`BUSY_OTHERS`). Such a tuning is not
written (three processes tuned while the test suite ran beside them had settled the ONNX
encoder's largest products on one thread, 26.6 ms a forward against 22.0 with fresh
choices), and its process uses it for a while only (:data:`PROVISIONAL_SECONDS`), then
times the bucket again: what ran beside it may have been passing.

**The file** (``autotune-<arch>-<cpus>cpu-<model>.json`` in the runtime's cache folder) may be
hostile: it is read only when it is a regular file under :data:`MAX_FILE_BYTES`, every
entry is checked (key form, known candidate, thread count within the key's limit) and a
bad one is skipped; a file that does not parse is ignored as a whole. Nothing in it is
ever executed. Writes re-read and merge under a lock file (so processes tuning side by
side keep each other's choices), keep at most :data:`MAX_ENTRIES`, and replace the file
atomically. ``EMBER_FUSION_DEBUG=1`` logs what was ignored and each choice made.

``EMBER_FUSION_AUTOTUNE=0`` turns tuning off: blocks run fused at the runtime's own
thread choice. Only runtimes with thread counts (``thread_count``) are tuned (the
interpreter runtime is not).

**Launch configurations.** A runtime with ``configs(block)`` (the Triton runtime) offers
labelled launch configurations instead of thread counts: its candidates are each
configuration (one "thread": a launch) and the unfused ops; a choice stores the label
(``"config"`` in the file, checked against the runtime's ``LABELS``). Such a runtime
also names its machine kind (``machine()``: the GPU), its size range to tune
(``tune_min_elements``, ``tune_max_elements``), whether it tunes at all (``tunes``: not
under Triton's interpreter) and a ``synchronize()`` the timings wait on (GPU launches
return before the kernel ends).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import platform
import re
import stat
import statistics
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ember.atomic import atomic_write
from ember.backend.environment import switch
from ember.backends.fusion import counters, ir

OP_KERNEL_FILES = ("op_kernels.py", "conv_epilogue.py", "numba_conv.py", "numba_conv_grad.py",
                   "numba_gemm.py", "numba_int8.py", "numba_pool.py", "numba_tile.py",
                   "triton_matmul.py", "attention.py", "attention_grad.py",
                   "numba_attention.py")  # fmt: skip
"""The sources of single-op kernels (``op_kernels``): a change to any of them voids the
choices between those kernels and the inner backend's ops (a faster kernel would
otherwise stay unchosen where a settled choice said the inner op)."""
VERSION = 6
"""The file format's and the tuning method's version: a change voids older choices (5:
version 4's timings could include a parallel launcher's load; 6: version 5 timed large
single ops and blocks at every thread count, see :data:`MAX_TUNED_WORK`)."""
SETTLED_AFTER = 3
"""Tunings after which a bucket's choice is kept even when they did not agree (see
"Settling" in the module doc); two in a row that agree settle it sooner."""
FORMAT = "ember-fusion-autotune"
BUDGET_SECONDS = 0.004
"""About how long one tuning may take, its warm-up runs included (unless they alone take longer)."""
MAX_ROUNDS = 5
MIN_ROUNDS = 3
"""Timed rounds a tuning makes at least when a round of its close candidates costs under
``MAX_TUNING_SECONDS / MIN_ROUNDS``."""
MAX_TUNING_SECONDS = 0.05
"""What the rounds a tuning makes at least may cost (a bucket is tuned at most a few times per
cache folder and machine kind: a 2 ms convolution at 1 and 2 threads is timed 3 times each)."""
MAX_ELEMENTS = 1 << 21
"""Blocks of more elements are not tuned: they run at the runtime's own thread count. A
thread's wake-up is small beside their work, and a fused pass beats the unfused ops'
several passes over tens of MB, while timing those ops would cost a second (16M f32
GELU: about 0.8 s unfused, 5 ms fused on 2 threads)."""
MAX_TUNED_WORK = 1 << 26
"""A single op is not timed at a thread count ``c`` below the runtime's when its work is at
least ``c`` times this (about half a millisecond of multiply-adds on one thread): at twice
the threads each still has a quarter of a millisecond or more, beside which a thread's
wake-up is small. On two threads, an op of this much work is timed on two only, against
the inner op. One or two runs of each count, all that a large op's tuning affords, chose
one thread on a host that takes a vCPU away for milliseconds: the transformer step's
weight-gradient products (10-14 ms each on one thread, 5-7 on two) settled there, and
the step ran at 1.3-1.55x torch at two threads instead of 1.1x."""
MAX_TUNED_ELEMENTS = 1 << 20
""":data:`MAX_TUNED_WORK` for a fused block, in elements: a block of at least ``c`` times
this is not timed at ``c`` threads below the runtime's (on two threads, a block of a
million elements or more is timed on two only, against its ops unfused). A block of two
million took 1.1-2.1 ms on two threads and 1.9-2.1 on one, and a tuning chose one."""
MAX_ENTRIES = 4096
"""The most choices a file keeps (the newest), and reads."""
MAX_FILE_BYTES = 1 << 20
"""A larger file is ignored (4096 entries take about 300 KB)."""
MAX_THREADS = 4096
"""The largest thread count a file may name (larger is absurd: ignored)."""
MAX_TUNINGS = 1000
"""The largest tuning count a file may name (a count is capped there)."""
_ENTRY_KEY = re.compile(r"[0-9a-f]{32}/(?:e\d{1,2}(?:r\d{1,2})?|w\d{1,2})/t(\d{1,4})")
_LABEL = re.compile(r"[a-z0-9]{1,40}")


@functools.cache
def _op_kernels_version() -> str:
    """A digest of :data:`OP_KERNEL_FILES` (read once per process)."""
    digest = hashlib.sha256()
    for name in OP_KERNEL_FILES:
        digest.update((Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Choice:
    """How a block runs: fused on ``threads`` threads (with the launch configuration
    labelled ``config``, for runtimes that have them), or ``unfused`` (``threads`` None)."""

    run: str  # "fused" or "unfused"
    threads: int | None = None
    config: str | None = None

    @property
    def setting(self) -> int | str | None:
        """What the runtime's ``run`` takes as its launch setting: the configuration's label
        where there is one, else the thread count."""
        return self.config if self.config is not None else self.threads

    def __str__(self) -> str:
        if self.run != "fused":
            return "unfused"
        return f"fused@{self.config}" if self.config is not None else f"fused@{self.threads}"


UNFUSED = Choice("unfused")


@dataclass(frozen=True)
class Pending:
    """A block of a (key, bucket) with no choice yet: the caller runs it as usual, then
    hands it to :meth:`Tuner.tune`."""

    key: tuple
    entry: str  # the choice's key in the file
    limit: int  # the runtime's thread count for this run
    earlier: Stored | None = None  # the file's unsettled choice for it, if any
    counts: tuple[int, ...] | None = None  # the thread counts to time (None: 1, 2, 4, ...)


@dataclass(frozen=True)
class Stored:
    """A choice as the file holds it: made by ``tunings`` tunings, the last ``streak`` of
    which agreed on it."""

    choice: Choice
    tunings: int = 1
    streak: int = 1

    @property
    def settled(self) -> bool:
        return self.streak >= 2 or self.tunings >= SETTLED_AFTER

    def after(self, choice: Choice) -> Stored:
        """The record once another tuning chose ``choice``."""
        tunings = min(self.tunings + 1, MAX_TUNINGS)
        if choice == self.choice:
            return Stored(choice, tunings, min(self.streak + 1, tunings))
        return Stored(choice, tunings, 1)


_forced: Choice | None = None


@contextlib.contextmanager
def forcing(choice: Choice) -> Iterator[None]:
    """Makes every block that would be tuned run as ``choice`` instead (no timing, nothing
    written): a test hook, to check each candidate computes what the others do."""
    global _forced
    previous, _forced = _forced, choice
    try:
        yield
    finally:
        _forced = previous


PROVISIONAL_SECONDS = (2.0, 10.0, 60.0)
"""How long a process uses a choice timed beside other processes before it times the
bucket again (the first, second and third such tuning of the bucket); the choice of a
fourth is kept for the process. What ran beside a tuning is often passing: the compiler
process of parallel launchers (``numba_parallel``) compiles in a new process's first
seconds, on a core the two-thread candidates need."""
BUSY_OTHERS = max(1, (os.cpu_count() or 1) // 2)
"""Running threads of other processes, at least, that make a tuning's timings unfit to
keep."""


def others_running() -> int:
    """Threads of other processes running on the machine now: Linux's count of runnable
    threads (``/proc/loadavg``) less this process's own; 0 where the OS does not say."""
    try:
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
        mine = 0
        for task in Path("/proc/self/task").iterdir():
            line = (task / "stat").read_text()
            mine += line[line.rindex(")") + 2] == "R"
    except (OSError, ValueError, IndexError):
        return 0
    return max(0, running - mine)


def enabled() -> bool:
    """Whether tuning is on (``EMBER_FUSION_AUTOTUNE`` is not ``0``)."""
    return switch("EMBER_FUSION_AUTOTUNE", True)


def machine() -> str:
    """The machine kind choices are made for: processor architecture, CPU count, and the
    CPU model and vector width numba compiles for (``numba_target.target_name``)."""
    from ember.backends.fusion.numba_target import target_name

    arch = re.sub(r"[^A-Za-z0-9_]", "", platform.machine()) or "cpu"
    model = re.sub(r"[^A-Za-z0-9_-]", "", target_name()) or "generic"
    return f"{arch}-{os.cpu_count() or 1}cpu-{model}"


_tuners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_tuners_lock = threading.Lock()


def tuner_for(runtime) -> Tuner | None:
    """The tuner of ``runtime`` (one per runtime, so per process and cache folder), or None
    when tuning is off or the runtime has no thread counts (``thread_count``)."""
    if not enabled():
        return None
    if not callable(getattr(runtime, "thread_count", None)):
        return None  # a runtime without thread counts (the interpreter) has nothing to tune
    if not getattr(runtime, "tunes", True):
        return None  # Triton's interpreter: its timings say nothing about a GPU
    with _tuners_lock:
        found = _tuners.get(runtime)
        if found is None:
            found = Tuner(runtime)
            _tuners[runtime] = found
        return found


class Tuner:
    """Chooses, remembers and persists how each (block key, size bucket) runs.

    Args:
        runtime: the runtime whose ``run(block, inputs, out, threads)`` the candidates call.
        folder: where the choices file lives; default the runtime's ``cache`` folder, else
            the fusion cache folder.
    """

    def __init__(self, runtime, folder: str | os.PathLike | None = None) -> None:
        from ember.backends.fusion import numba_runtime
        from ember.backends.fusion.cache_folder import cache_dir

        self.runtime = runtime
        if folder is None:
            folder = getattr(runtime, "cache", None) or cache_dir()
        own = getattr(runtime, "machine", None)
        self.machine = own() if callable(own) else machine()
        self.path = Path(folder) / f"autotune-{self.machine}.json"
        self.min_elements = getattr(runtime, "tune_min_elements", numba_runtime.PARALLEL_MIN)
        self.max_elements = getattr(runtime, "tune_max_elements", MAX_ELEMENTS)
        self.labels = getattr(runtime, "LABELS", None)  # its launch configurations, if any
        self.synchronize = getattr(runtime, "synchronize", None) or (lambda: None)
        self.debug = switch("EMBER_FUSION_DEBUG", False)
        # Kernels of a changed generator may run at other speeds: their choices start over.
        self._salt = f"{VERSION}\n{getattr(runtime, '_version', '')}\n"
        self._choices: dict[tuple, Choice] = {}  # (key, bucket, thread limit) -> choice
        self._forgets = 0  # calls of forget(): a choice kept on a block before one is stale
        # Choices timed beside other processes: key -> (when it is timed again, tunings so
        # far while busy); the earliest of those times
        self._provisional: dict[tuple, tuple[float, int]] = {}
        self._busy_tunings: dict[tuple, int] = {}
        self._next_expiry = math.inf
        self._stored: dict[str, Stored] | None = None  # the file's valid entries, once read
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ choosing
    def lookup(self, block: ir.Block) -> Choice | Pending | None:
        """How ``block`` runs: a :class:`Choice`, :class:`Pending` when its bucket was never
        tuned, or None when it is not tuned (too small or too large: the runtime's own
        thread choice)."""
        elements = math.prod(block.shape)
        if not self.min_elements <= elements <= self.max_elements:
            return None
        if _forced is not None:
            return _forced
        if self._provisional:
            self._expire()
        limit = self.thread_limit()
        # A settled choice is kept on the block (templates bind the same block flush after
        # flush): no hash of its key a launch.
        kept = block.__dict__.get("_tuned")
        if kept is not None and kept[0] is self and kept[1] == limit and kept[2] == self._forgets:
            return kept[3]
        bucket = f"e{elements.bit_length()}"
        if block.axis is not None:
            bucket += f"r{block.shape[block.axis].bit_length()}"
        found = self._find(block.key(), bucket)
        if type(found) is Choice:
            object.__setattr__(block, "_tuned", (self, limit, self._forgets, found))
        return _sure_counts(found, elements, MAX_TUNED_ELEMENTS)

    def lookup_op(self, key: tuple, work: int) -> Choice | Pending | None:
        """How a single op with a compiled kernel runs (``op_kernels``): ``key`` is what the
        choice depends on besides size (op, dtype, options), ``work`` its multiply-adds or
        window reads (its bucket is their power of two). A :class:`Choice` of ``fused``
        means the compiled kernel at that thread count, ``unfused`` the inner backend's
        op; None when it is too small to time (then the inner op runs)."""
        if work < self.min_elements:
            return None
        if _forced is not None:
            return _forced
        if self._provisional:
            self._expire()
        found = self._find(("op", _op_kernels_version(), *key), f"w{work.bit_length()}")
        return _sure_counts(found, work, MAX_TUNED_WORK)

    def _find(self, key: tuple, bucket: str) -> Choice | Pending:
        limit = self.thread_limit()
        found = self._choices.get((key, bucket, limit))
        if found is not None:
            return found
        digest = hashlib.sha256(f"{self._salt}{key!r}".encode()).hexdigest()[:32]
        entry = f"{digest}/{bucket}/t{limit}"
        with self._lock:
            if self._stored is None:
                self._stored = self._read()
            stored = self._stored.get(entry)
            if stored is not None and stored.settled:
                self._choices[(key, bucket, limit)] = stored.choice
                return stored.choice
        return Pending((key, bucket, limit), entry, limit, stored)

    def generation(self) -> tuple:
        """What a settled choice kept outside the tuner holds for: the thread limit, the
        calls of :meth:`forget` (expiries of provisional choices among them) and the choice
        :func:`forcing` imposes (a choice kept before any of them changed is stale)."""
        if self._provisional:
            self._expire()
        return self.thread_limit(), self._forgets, _forced

    def _expire(self) -> None:
        """Drops the provisional choices whose time is up (their buckets are timed again),
        making every choice kept outside the tuner stale."""
        now = time.monotonic()
        if now < self._next_expiry:
            return
        with self._lock:
            for key, (deadline, _) in list(self._provisional.items()):
                if deadline <= now:
                    del self._provisional[key]
                    self._choices.pop(key, None)
            self._next_expiry = min((d for d, _ in self._provisional.values()), default=math.inf)
            self._forgets += 1

    def thread_limit(self) -> int:
        """The runtime's thread count for a large block."""
        return self.runtime.thread_count()

    def tune(self, pending: Pending, block: ir.Block, inputs: list,
             run_unfused: Callable[[], object]) -> Choice:  # fmt: skip
        """Times the candidates for ``pending``'s bucket on ``block`` and ``inputs`` (the
        arrays of a run that already happened: the kernel is compiled), remembers the
        fastest and writes it to the file. ``run_unfused`` computes the block's records on
        the inner backend without storing anything. A candidate that fails (or a file that
        cannot be written) never fails the caller: the block then keeps running fused."""
        runtime = self.runtime
        release = getattr(runtime, "release", None)
        configs = getattr(runtime, "configs", None)
        candidates = None
        if configs is not None:
            candidates = [Choice("fused", 1, c.label) for c in configs(block)]

        def run_fused(choice: Choice) -> None:
            for array in runtime.run(block, inputs, None, choice.setting):
                if release is not None:
                    release(array)  # a candidate's outputs: nobody else holds them

        return self._tune(pending, candidates, run_fused, run_unfused,
                          f"shape {list(block.shape)}")  # fmt: skip

    def tune_with(self, pending: Pending, run_fused: Callable[[int], object],
                  run_unfused: Callable[[], object], what: str = "") -> Choice:  # fmt: skip
        """:meth:`tune` for any candidates: ``run_fused(threads)`` runs the compiled
        kernel, ``run_unfused()`` the inner backend's ops (neither stores anything)."""
        return self._tune(pending, None, lambda c: run_fused(c.threads), run_unfused, what)

    def tune_configs(self, pending: Pending, configs: list[str],
                     run_fused: Callable[[str], object], run_unfused: Callable[[], object],
                     what: str = "") -> Choice:  # fmt: skip
        """:meth:`tune` for a kernel with launch configurations (labels ``configs``):
        ``run_fused(label)`` runs it, ``run_unfused()`` the inner ops."""
        candidates = [Choice("fused", 1, c) for c in configs]
        return self._tune(pending, candidates, lambda c: run_fused(c.config), run_unfused, what)

    def _tune(self, pending: Pending, candidates: list[Choice] | None,
              run_fused: Callable[[Choice], object], run_unfused: Callable[[], object],
              what: str) -> Choice:  # fmt: skip
        """Times ``candidates`` (default: ``pending``'s thread counts) and the unfused ops,
        keeps and saves the fastest."""
        if candidates is None:
            counts = pending.counts or _thread_counts(pending.limit)
            candidates = [Choice("fused", t) for t in counts]
        started = time.perf_counter()
        busy = others_running()
        try:
            choice, times = self._time(candidates, run_fused, run_unfused)
            busy = max(busy, others_running())
        except Exception as error:  # timing must never change what the user's step does
            self._log(f"tuning failed ({type(error).__name__}: {error}); running fused")
            self._choices[pending.key] = candidates[-1 if candidates[0].config is None else 0]
            return self._choices[pending.key]
        counters.add("tunings")
        self._choices[pending.key] = choice
        stored = pending.earlier.after(choice) if pending.earlier else Stored(choice)
        unfit = busy >= BUSY_OTHERS
        if unfit:
            self._keep_provisionally(pending.key)
        if self.debug:
            shown = ", ".join(f"{c}: {t * 1e3:.3f} ms" for c, t in times.items())
            kept = (f"{busy} other threads running: not written" if unfit
                    else f"tuning {stored.tunings}, {stored.streak} agreeing")  # fmt: skip
            self._log(f"{pending.entry} {what}: {choice} ({shown}; tuned in "
                      f"{(time.perf_counter() - started) * 1e3:.1f} ms; {kept})")  # fmt: skip
        if not unfit:
            self._save(pending.entry, stored)
        return choice

    def _keep_provisionally(self, key: tuple) -> None:
        """Marks the choice just made for ``key``, timed beside other processes, to be
        timed again after a while (:data:`PROVISIONAL_SECONDS`)."""
        with self._lock:
            busy = self._busy_tunings[key] = self._busy_tunings.get(key, 0) + 1
            if busy <= len(PROVISIONAL_SECONDS):
                deadline = time.monotonic() + PROVISIONAL_SECONDS[busy - 1]
                self._provisional[key] = (deadline, busy)
                self._next_expiry = min(self._next_expiry, deadline)

    def _time(self, fused: list[Choice], run_fused: Callable[[Choice], object],
              run_unfused: Callable[[], object]) -> tuple[Choice, dict[Choice, float]]:  # fmt: skip
        from ember.backends.fusion.numba_parallel import loads

        sync = self.synchronize

        def once(choice: Choice) -> float:
            # A run that loaded a parallel launcher timed the load (10-170 ms, once): with
            # it, a large product's two-thread candidate lost to one thread for good.
            for _ in range(2):
                loaded = loads()
                sync()
                began = time.perf_counter()
                if choice.run == "unfused":
                    run_unfused()
                else:
                    run_fused(choice)
                sync()  # a GPU launch returns before its kernel ends
                seconds = time.perf_counter() - began
                if loads() == loaded:
                    break
            return seconds

        # The fused candidates are timed first, warm-up and rounds, and the unfused one
        # after them: after a GEMM, OpenBLAS's threads spin for a while on the other cores,
        # and a fused run in parts timed then waits for a core it has in production (on
        # 2 cores the 2-thread convolutions lost to 1 thread that way, 1.9 ms against
        # 1.2). Each group gets a warm-up round (threads wake, fresh pages map) and a
        # second look at its affordable candidates; the clear losers go, judged by their
        # best run, since a stall (a thread waiting for a core) only ever makes a run slower.
        started = time.perf_counter()
        runs: dict[Choice, list[float]] = {}
        timed: dict[Choice, list[float]] = {}
        for group, share in ((fused, 0.75), ([UNFUSED], 1.0)):
            for c in group:
                runs[c] = [once(c)]
                # A first run may start threads or map pages: a second look at every
                # candidate that is affordable keeps it from being dropped for that.
                if runs[c][0] < MAX_TUNING_SECONDS / (len(fused) + 1):
                    runs[c].append(once(c))
            floor = min(min(r) for r in runs.values())
            live = [c for c in group if min(runs[c]) <= 2 * floor]
            # Rounds while the budget lasts; at least MIN_ROUNDS of the close candidates
            # while they stay within MAX_TUNING_SECONDS (one warm-up run apiece decides
            # nothing between two candidates a few percent apart).
            cost = sum(min(runs[c]) for c in live)
            least = MIN_ROUNDS if cost * MIN_ROUNDS < MAX_TUNING_SECONDS else 0
            timed.update({c: [] for c in live})
            for done in range(MAX_ROUNDS):
                over = time.perf_counter() - started > BUDGET_SECONDS * share
                if not live or (over and done >= least):
                    break
                for c in live:
                    timed[c].append(once(c))
        floor = min(min(r) for r in runs.values())
        live = [c for c in timed if min(runs[c]) <= 2 * floor]
        # The rounds' runs, or (none: a costly candidate) the warm-up's second look.
        scores = {c: _score(c, timed[c] or runs[c][1:] or runs[c]) for c in live}
        chosen = min(scores, key=scores.__getitem__)
        return chosen, {c: scores.get(c, min(r)) for c, r in runs.items()}

    def forget(self) -> None:
        """Drops every choice this process holds, so the next lookups read the file again."""
        with self._lock:
            self._choices.clear()
            self._stored = None
            self._provisional.clear()
            self._next_expiry = math.inf
            self._forgets += 1

    # ------------------------------------------------------------------ the file
    def _read(self) -> dict[str, Stored]:
        """The file's valid entries (empty when it is missing, too large or malformed)."""
        try:
            data = read_bounded(self.path)
        except OSError as error:
            if not isinstance(error, FileNotFoundError):
                self._log(f"ignoring {self.path}: {error}")
            return {}
        try:
            document = json.loads(data)
        except (ValueError, RecursionError) as error:
            self._log(f"ignoring {self.path}: not JSON ({type(error).__name__})")
            return {}
        wanted = {"format": FORMAT, "version": VERSION, "machine": self.machine}
        if type(document) is not dict or any(document.get(k) != v for k, v in wanted.items()):
            self._log(f"ignoring {self.path}: not a version {VERSION} choices file of "
                      f"{self.machine}")  # fmt: skip
            return {}
        entries = document.get("choices")
        if type(entries) is not dict:
            self._log(f"ignoring {self.path}: 'choices' is not an object")
            return {}
        valid: dict[str, Stored] = {}
        skipped = 0
        for entry, value in list(entries.items())[-MAX_ENTRIES:]:
            stored = _parse_entry(entry, value, self.labels)
            if stored is None:
                skipped += 1
            else:
                valid[entry] = stored
        if skipped:
            self._log(f"{self.path}: ignored {skipped} malformed entries")
        return valid

    def _save(self, entry: str, stored: Stored) -> None:
        """Adds ``entry`` to the file: re-read under the lock, merged, written atomically."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with _locked(self.path.with_name(self.path.name + ".lock")), self._lock:
                merged = self._read()
                merged.pop(entry, None)
                merged[entry] = stored  # last: the newest survive the cap
                merged = dict(list(merged.items())[-MAX_ENTRIES:])
                self._stored = merged
                document = {
                    "format": FORMAT, "version": VERSION, "machine": self.machine,
                    "choices": {e: _entry_value(c) for e, c in merged.items()},
                }  # fmt: skip
                atomic_write(self.path, json.dumps(document, indent=0).encode())
        except OSError as error:  # a read-only cache keeps the choice for this process only
            self._log(f"could not write {self.path}: {error}")

    def _log(self, message: str) -> None:
        if self.debug:
            print(f"[ember.fusion] autotune: {message}", file=sys.stderr)


def _thread_counts(limit: int) -> list[int]:
    """The thread counts a tuning times: the powers of two up to ``limit``, and ``limit``."""
    return sorted({1 << i for i in range(limit.bit_length()) if 1 << i <= limit} | {limit})


def _sure_counts(found: Choice | Pending, size: int, per_thread: int) -> Choice | Pending:
    """``found``, a :class:`Pending` one to be timed only at the thread counts ``c`` that
    twice as many threads do not surely beat: the limit, and those where ``size`` is under
    ``c * per_thread`` (see :data:`MAX_TUNED_WORK`)."""
    if type(found) is not Pending:
        return found
    counts = [c for c in _thread_counts(found.limit) if c == found.limit or size < per_thread * c]
    return dataclasses.replace(found, counts=tuple(counts))


def _score(choice: Choice, samples: list[float]) -> float:
    """A candidate's expected seconds per run. One thread (fused, or NumPy's unfused ops):
    the median, since the process being preempted now and then is noise that strikes any
    candidate. Several threads: the mean less the largest sample, since on a loaded
    machine one of them often waits a scheduler tick for a core (4 ms beside a 0.05 ms
    kernel) in a fraction of its runs, a cost of the candidate itself that a median would
    hide."""
    if choice.run == "unfused" or choice.threads == 1:
        return statistics.median(samples)
    if len(samples) >= 3:
        samples = sorted(samples)[:-1]
    return statistics.fmean(samples)


def _entry_value(stored: Stored) -> dict:
    choice = stored.choice
    value = {"run": choice.run, "threads": choice.threads, "tunings": stored.tunings,
             "streak": stored.streak}  # fmt: skip
    if choice.config is not None:
        value["config"] = choice.config
    return value


def _parse_entry(entry: object, value: object, labels: frozenset[str] | None = None
                 ) -> Stored | None:  # fmt: skip
    """The choice an entry of the file names, with its tuning counts, or None when
    anything about it is off (``labels``: the launch configurations the runtime has, None
    when it has none)."""
    if type(entry) is not str or type(value) is not dict:
        return None
    config = None
    if labels is not None and value.get("run") == "fused":
        config = value.get("config")
        if type(config) is not str or not _LABEL.fullmatch(config) or config not in labels:
            return None
        value = {k: v for k, v in value.items() if k != "config"}
    if set(value) != {"run", "threads", "tunings", "streak"}:
        return None
    key = _ENTRY_KEY.fullmatch(entry)
    if key is None:
        return None
    tunings, streak = value["tunings"], value["streak"]
    if type(tunings) is not int or type(streak) is not int:
        return None
    if not 1 <= streak <= tunings <= MAX_TUNINGS:
        return None
    run, threads = value["run"], value["threads"]
    if run == "unfused":
        return Stored(UNFUSED, tunings, streak) if threads is None else None
    limit = int(key[1])
    if run != "fused" or type(threads) is not int or not 1 <= threads <= min(limit, MAX_THREADS):
        return None
    return Stored(Choice("fused", threads, config), tunings, streak)


def read_bounded(path: Path) -> bytes:
    """The bytes of ``path`` when it is a regular file of at most MAX_FILE_BYTES (OSError
    otherwise): a FIFO or device in its place must not block or stream forever."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise OSError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
        with os.fdopen(fd, "rb", closefd=False) as file:
            data = file.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise OSError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
        return data
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(path: Path, wait: float = 0.2) -> Iterator[None]:
    """Holds an exclusive lock on ``path`` while writers merge, where the platform has
    ``flock``; after ``wait`` seconds without it (a stuck or hostile holder) it goes on
    unlocked: at worst one process's newest choice is lost and timed again later."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: merge without a lock
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NONBLOCK", 0), 0o666)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.005)
        yield
    finally:
        os.close(fd)  # closing releases the lock
