"""The numba runtime: compiles an ``ir.Block`` to a parallel CPU kernel and runs it.

numba is optional (``pip install ember[jit]``). Importing this module never fails;
:func:`available` says whether numba is there, and :class:`NumbaRuntime` raises
:class:`~ember.backend.errors.BackendUnavailableError` naming the extra when it is not.

**Compiling.** A kernel's source is generated from the block (``numba_source``) and
written as a real module file ``k_<hash>.py`` into the cache folder, ``<hash>`` covering
the generated source and the generator's own source, so numba's ``cache=True`` keeps the
machine code in ``__pycache__`` next to it and a new process loads it instead of
compiling. Blocks whose keys differ only where the kernel does not see it (dims of size
1, dims merged into one loop: a ``[4]`` and a ``[2, 1, 3]`` chain of the same ops) have
the same source and share one kernel. The folder is ``EMBER_FUSION_CACHE``, else
``$XDG_CACHE_HOME/ember/fusion`` (``~/.cache/ember/fusion``); code runs from it only while
no other user can write it (``cache_folder``). Within a process, kernels are kept by key.

**Inputs** may be any NumPy arrays of the block's shapes and dtypes: arrays that are not
C-contiguous (transposed or sliced views, from torch or NumPy) are copied to contiguous
ones first; the kernel itself only sees flat contiguous memory. Outputs go into ``out``
when given (C-contiguous, writable, of the output's shape and dtype), else into buffers of
the runtime's :class:`~ember.backends.fusion.buffers.BufferPool`; hand those back with
:meth:`NumbaRuntime.release` once nobody reads them.

**Blocks it cannot take** (f16/bf16 or other dtypes, unknown ops) raise
:class:`~ember.backends.fusion.numba_source.KernelUnsupported`, an ``UnsupportedError``:
the caller runs the block's ops unfused. So does a run where NumPy would raise (an int
raised to a negative power): the unfused ops then raise NumPy's own error.

**Threads.** Each run uses ``threads`` when the run names it; otherwise one thread below
:data:`PARALLEL_MIN` elements, and above it the runtime's count (its argument, else
``EMBER_FUSION_THREADS``, else ``NUMBA_NUM_THREADS``: every core by default). A large
block's tasks are split into up to :data:`PARTS_PER_THREAD` parts a thread (:func:`_parts`),
and the kernel is called once a thread, each call claiming parts until none is left
(``numba_source``). The calls run on numba's own threads where ``numba_parallel`` can
(the default), else the calling thread makes the first and worker threads of the
process the others, or the calling thread itself when it is done before a worker woke
(see ``_Workers``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ember.atomic import atomic_write
from ember.backend.environment import count
from ember.backend.errors import BackendUnavailableError, ShapeError, fmt_shape
from ember.backends.fusion import ir, numba_parallel
from ember.backends.fusion.buffers import BufferPool, PooledOutputs
from ember.backends.fusion.cache_folder import cache_dir, check_module, code_folder
from ember.backends.fusion.numba_source import KernelUnsupported, scalar_dtypes
from ember.backends.fusion.numba_target import CACHE_LINE_BYTES
from ember.backends.ndarray import layout
from ember.tensor.dtype import DType

try:  # numba is optional: everything below that needs it checks available() first
    import numba
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = None

__all__ = ["KernelUnsupported", "NumbaRuntime", "RuntimeStats", "available"]

_CHUNK = 16384  # inner-loop length of element-wise tasks: long enough to vectorize well
PARALLEL_MIN = 1 << 16
"""Blocks of fewer elements run on one thread unless told otherwise: waking the others
costs more than they save (tens of microseconds; milliseconds on a loaded machine)."""
PART_ELEMENTS = 1 << 17
"""Elements a part of a block's tasks holds at least when a run is split finer than one
part per thread (each part is a call of the kernel: a few microseconds)."""
PARTS_PER_THREAD = 8
"""The most parts per thread a run is split into (see :func:`_parts`)."""
_HERE = Path(__file__).parent
_GENERATOR_FILES = ("numba_source.py", "numba_math.py", "ir.py")


def available() -> bool:
    """Whether numba is installed, so that :class:`NumbaRuntime` can run."""
    return numba is not None


def _require() -> None:
    if numba is None:
        raise BackendUnavailableError(
            "fusion: the numba runtime needs numba; install the extra: pip install 'ember[jit]'"
        )


def load_generated(folder: Path, name: str, source: str, package: str) -> Any:
    """The module of generated ``source``, kept as ``folder/<name>.py`` and imported as
    ``<package>.<name>``, so that numba's disk cache keeps its functions' machine code
    beside it.

    Raises:
        UnsafeCacheError: another user could write ``folder`` or numba's files in it
            (``cache_folder``); nothing is imported then.
    """
    path = code_folder(folder) / f"{name}.py"
    # Rewriting an identical file would change its time stamp and void numba's cache.
    if not path.exists() or path.read_bytes() != source.encode():
        atomic_write(path, source.encode())
    return import_file(path, f"{package}.{name}")


def import_file(path: Path, module_name: str) -> Any:
    """The module of the file ``path`` in a cache folder as ``module_name`` (imported where
    not yet, once ``cache_folder.check_module`` passes it)."""
    module = sys.modules.get(module_name)
    # One of another cache folder may be loaded already (the same source): load this
    # folder's file, so numba keeps the machine code here too (same name, same code).
    if module is None or Path(module.__file__) != Path(path):
        check_module(path)
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[module_name] = module
    return module


def _generator_version() -> str:
    """A digest of the generator's source: a changed generator never meets an old kernel."""
    digest = hashlib.sha256()
    for name in _GENERATOR_FILES:
        digest.update((_HERE / name).read_bytes())
    return digest.hexdigest()[:16]


@dataclass
class RuntimeStats:
    """Counters of a runtime: kernels ``compiled`` by numba, loaded from the ``disk_hits``
    cache, found in memory (``memory_hits``), ``launches``, and the seconds spent in
    compiling or loading (``compile_seconds``)."""

    compiled: int = 0
    disk_hits: int = 0
    memory_hits: int = 0
    launches: int = 0
    compile_seconds: float = 0.0


@dataclass
class _Kernel:
    dispatcher: Any
    source_path: Path
    scalar_dtypes: tuple[np.dtype, ...]
    groups: tuple[tuple[int, ...], ...]  # the block dims of each of the kernel's groups
    ready: bool = False  # whether the first call (compile or disk load) happened


class NumbaRuntime(PooledOutputs):
    """Compiles blocks to numba kernels, once per ``Block.key()``, and runs them.

    Args:
        cache: the folder of generated kernels; default ``cache_folder.cache_dir()``.
        threads: the thread count of each run of at least :data:`PARALLEL_MIN` elements
            unless the run names one.
        pool: where outputs come from when ``run`` is given no ``out``.

    Raises:
        UnsafeCacheError: another user could write the cache folder (``cache_folder``).
    """

    def __init__(self, cache: str | os.PathLike | None = None, threads: int | None = None,
                 pool: BufferPool | None = None) -> None:  # fmt: skip
        _require()
        self.cache = code_folder(cache if cache is not None else cache_dir())
        if threads is None:
            threads = count("EMBER_FUSION_THREADS", "threads")
        self.threads = threads
        self.pool = pool if pool is not None else BufferPool()
        self.stats = RuntimeStats()
        self._kernels: dict[tuple, _Kernel] = {}
        self._modules: dict[str, Any] = {}  # by source digest: blocks of one source share it
        self._lock = threading.Lock()
        self._version = _generator_version()

    # ------------------------------------------------------------------ compiling
    def kernel(self, block: ir.Block) -> _Kernel:
        """The compiled kernel of ``block`` (generated and loaded on first use of its key)."""
        key = block.key()
        with self._lock:
            found = self._kernels.get(key)
            if found is not None:
                self.stats.memory_hits += 1
                return found
            found = self._load(block, key)
            self._kernels[key] = found
            return found

    def prefetches(self) -> bool:
        """Whether one-loop element-wise kernels run here in runs that prefetch rather than
        in a plain loop (``numba_prefetch``: the variable, else timed once per machine)."""
        from ember.backends.fusion.numba_prefetch import prefetching

        return prefetching(self.cache, self._module)

    def _load(self, block: ir.Block, key: tuple) -> _Kernel:
        from ember.backends.fusion.numba_source import generate, layout, streams_in_one_loop

        module = self._module(generate(block, streams_in_one_loop(block) and self.prefetches()))
        dtypes = tuple(np.dtype(_numpy_dtype(d)) for d in scalar_dtypes(block))
        return _Kernel(module.kernel, Path(module.__file__), dtypes, layout(block).groups)

    def _module(self, source: str) -> Any:
        """The module of generated ``source``: imported once per process, compiled once per
        cache folder."""
        digest = hashlib.sha256(f"{self._version}\n{source}".encode()).hexdigest()[:32]
        module = self._modules.get(digest)
        if module is None:
            module = self._modules[digest] = self._import(digest, source)
        return module

    def _import(self, digest: str, source: str) -> Any:
        return load_generated(self.cache, f"k_{digest}", source, "ember_fusion_kernels")

    # ------------------------------------------------------------------ running
    def run(self, block: ir.Block, inputs: list[np.ndarray], out: list[np.ndarray] | None = None,
            threads: int | None = None) -> list[np.ndarray]:  # fmt: skip
        """Computes ``block`` on ``inputs`` (arrays of its inputs' shapes and dtypes, one
        size per block dim); returns its outputs, written into ``out`` when given (a None
        entry of ``out`` comes from the pool). An element-wise block may write over an
        input exactly; other overlaps run into fresh buffers first. An element-wise block
        whose full-size inputs are all permuted alike (a product's rows in its operand's
        order) runs in their memory order, into pooled outputs laid out the same way,
        rather than copying them first."""
        if out is None:
            plain = block.__dict__.get("_numba_plain")
            if plain is not None and plain[0] is self and (
                    launch := plain[1].get((threads, self.threads))):  # fmt: skip
                outputs = launch.run(inputs)
                if outputs is not None:
                    return outputs
        block, inputs = _broadcast_views(block, inputs)
        order = _memory_order(block, inputs) if out is None or not any(
            o is not None for o in out) else None  # fmt: skip
        if order is not None:
            outputs = [self.pool.take(block.register_shape(r),
                                      _numpy_dtype(block.register_dtype(r)), order)
                       for r in block.outputs]  # fmt: skip
            self.run(_permuted(block, order), [a.transpose(order) for a in inputs],
                     [o.transpose(order) for o in outputs], threads)  # fmt: skip
            return outputs
        arrays, copies = _inputs(block, inputs, self.pool.take)
        try:
            return self._run(block, arrays, out, threads)
        finally:
            for copy in copies:  # read by the kernel only, which has returned
                self.pool.release(copy)

    def _launch_data(self, block: ir.Block) -> tuple:
        """``(kernel, outputs' shapes and dtypes, loop sizes, scalar arguments)`` of
        ``block``, kept on the block: a template binds the same block flush after flush
        (``elementwise.Template.bind``), so its launch is worked out once.

        Raises:
            KernelUnsupported: a scalar that does not fit its tensor's dtype.
        """
        found = block.__dict__.get("_numba_launch")
        if found is not None and found[0] is self:
            self.stats.memory_hits += 1
            return found[1]
        kernel = self.kernel(block)
        wanted = tuple((block.register_shape(r), _numpy_dtype(block.register_dtype(r)))
                       for r in block.outputs)  # fmt: skip
        sizes = tuple(math.prod(block.shape[d] for d in dims) for dims in kernel.groups)
        scalars = tuple(_scalar(v, d) for v, d in zip(block.scalars(), kernel.scalar_dtypes))
        data = (kernel, wanted, sizes, scalars)
        object.__setattr__(block, "_numba_launch", (self, data))  # beside the frozen fields
        return data

    def _run(self, block: ir.Block, arrays: list[np.ndarray], out: list[np.ndarray] | None,
             threads: int | None) -> list[np.ndarray]:  # fmt: skip
        kernel, wanted, sizes, scalars = self._launch_data(block)
        outputs = self._outputs(wanted, out)
        if out is not None and not _writes_safely(block, outputs, arrays):
            # Kernels may store an intermediate in an output and read it back (numba_source
            # ``_stash``): an output over an input would clobber it. Run into fresh buffers.
            fresh = self._run(block, arrays, None, threads)
            for o, f in zip(outputs, fresh):
                np.copyto(o, f)
                self.pool.release(f)
            return outputs
        tail = [*scalars, *sizes, _CHUNK]
        if not kernel.ready:
            # The first call compiles, loads from disk, or finds the kernel another block of
            # the same source compiled: one part, on this thread.
            before = _compiles(kernel.dispatcher)
            started = time.perf_counter()
            raised = _launch(self, kernel.dispatcher, arrays, outputs, tail, 1, 1)
            self._first_call(kernel, before, time.perf_counter() - started)
            if raised:
                raise KernelUnsupported(_NEGATIVE_POWER)
            return outputs
        plain = block.__dict__.get("_numba_plain")
        if plain is None or plain[0] is not self:
            # By the thread count asked (the tuner's candidates) and the runtime's own,
            # which a run that asks none takes (a benchmark sets it between its rows).
            plain = (self, {})
            object.__setattr__(block, "_numba_plain", plain)
        launch = plain[1].get((threads, self.threads))
        if launch is None:
            count = threads
            if count is None:
                # Waking other threads for a small block costs more than the block.
                count = 1 if math.prod(block.shape) < PARALLEL_MIN else self.thread_count()
            count = max(1, min(int(count), _MAX_THREADS))
            launch = plain[1][threads, self.threads] = _PlainLaunch(
                self, block, kernel, wanted, tail, count, _parts(count, math.prod(block.shape)))
        launch.launch(arrays, outputs)
        return outputs

    def thread_count(self) -> int:
        """The threads of a run of at least :data:`PARALLEL_MIN` elements that names none
        (see the module doc)."""
        return max(1, min(int(self.threads or numba.config.NUMBA_NUM_THREADS), _MAX_THREADS))

    def _first_call(self, kernel: _Kernel, before: tuple[int, int], seconds: float) -> None:
        kernel.ready = True
        overloads, hits = (now - then for now, then in zip(_compiles(kernel.dispatcher), before))
        with self._lock:
            if hits:
                self.stats.disk_hits += 1
            elif overloads:
                self.stats.compiled += 1
            else:
                self.stats.memory_hits += 1
                return
            self.stats.compile_seconds += seconds

    def _outputs(self, wanted: tuple, out: list[np.ndarray] | None) -> list[np.ndarray]:
        if out is None:
            return [self.pool.take(shape, dtype) for shape, dtype in wanted]
        if len(out) != len(wanted):
            raise ShapeError(f"numba runtime: {len(out)} output arrays for {len(wanted)} outputs")
        out = [self.pool.take(*w) if o is None else o for o, w in zip(out, wanted)]
        for o, (array, (shape, dtype)) in enumerate(zip(out, wanted)):
            fits = (array.shape == shape and array.dtype == dtype
                    and array.flags.c_contiguous and array.flags.writeable)  # fmt: skip
            if not fits:
                raise ShapeError(
                    f"numba runtime: output {o} must be a writable C-contiguous {dtype} array "
                    f"of shape {fmt_shape(shape)}, got {array.dtype} {fmt_shape(array.shape)}"
                )
        return list(out)


class _PlainLaunch:
    """A block's launch worked out once, for the common call: inputs exactly the block's
    shapes and dtypes and C-contiguous, outputs from the pool (``NumbaRuntime.run`` checks
    nothing else then: no broadcast view, permuted order or copy to make, and pooled
    outputs never overlap an input). On a step's cold cache, the general path's Python
    cost about 15 us more a launch (layer norm over ``[4096, 1024]`` replayed at two threads:
    0.770-0.775 -> 0.748-0.756 ms, alternating processes)."""

    __slots__ = ("calls", "inputs", "kernel", "parts", "realign", "runtime", "tail", "wanted")

    def __init__(self, runtime: NumbaRuntime, block: ir.Block, kernel: _Kernel, wanted: tuple,
                 tail: list, calls: int, parts: int) -> None:  # fmt: skip
        self.runtime, self.kernel, self.wanted, self.tail = runtime, kernel.dispatcher, wanted, tail
        self.inputs = tuple((i.shape, _numpy_dtype(i.dtype)) for i in block.inputs)
        self.calls, self.parts = calls, parts
        self.realign = reread_inputs(block)

    def run(self, inputs: list) -> list[np.ndarray] | None:
        """The block's outputs for ``inputs``; None, running nothing, where an input is not
        exactly as the launch expects (the general path runs it)."""
        if len(inputs) != len(self.inputs):
            return None
        for array, (shape, dtype) in zip(inputs, self.inputs):
            if (type(array) is not np.ndarray or array.shape != shape or array.dtype != dtype
                    or not array.flags.c_contiguous):  # fmt: skip
                return None
        take = self.runtime.pool.take
        outputs = [take(shape, dtype) for shape, dtype in self.wanted]
        self.launch(inputs, outputs)
        return outputs

    def launch(self, arrays: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        """Runs the kernel on C-contiguous ``arrays`` into ``outputs``, a call a thread
        (those of :func:`reread_inputs` that do not start on a cache line copied first to
        one that does)."""
        if self.realign:
            arrays = list(arrays)
            for i in self.realign:
                array = arrays[i]
                if array.__array_interface__["data"][0] % CACHE_LINE_BYTES:
                    arrays[i] = aligned_copy(array)
        if _launch(self.runtime, self.kernel, arrays, outputs, self.tail, self.parts, self.calls):
            raise KernelUnsupported(_NEGATIVE_POWER)


REALIGN_MAX_BYTES = 1 << 16
"""Inputs up to this size that a kernel reads again and again start on a cache line
(:func:`reread_inputs`)."""
REALIGN_MIN_ELEMENTS = 1 << 18
"""Blocks of fewer elements copy nothing: there the copy would cost over 1% of a launch."""


def reread_inputs(block: ir.Block) -> tuple[int, ...]:
    """The inputs of ``block`` a launch copies to a cache line's start where they lie off
    one: small ones (:data:`REALIGN_MAX_BYTES`) that run along the last dim and are
    broadcast over the others of a large block (:data:`REALIGN_MIN_ELEMENTS`), which the
    kernel reads once a row, such as a layer norm's weight and bias. Read off a line, every
    vector load of them spans two lines: a layer norm over ``[4096, 1024]`` at one thread
    took 1.15-1.32 ms with its weight 16 bytes past a line against 1.00-1.09 ms with both
    on one, in the same process."""
    if math.prod(block.shape) < REALIGN_MIN_ELEMENTS:
        return ()
    found = []
    for i, spec in enumerate(block.inputs):
        broadcast = any(n == 1 < m for n, m in zip(spec.shape, block.shape))
        along = spec.shape[-1] == block.shape[-1] > 1  # a row's worth, read vector by vector
        size = math.prod(spec.shape) * _numpy_dtype(spec.dtype).itemsize
        if broadcast and along and size <= REALIGN_MAX_BYTES:
            found.append(i)
    return tuple(found)


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``array`` that starts on a cache line (its own memory, a
    launch's: threads launching the same block never share it)."""
    raw = np.empty(array.nbytes + CACHE_LINE_BYTES, np.uint8)
    start = -raw.__array_interface__["data"][0] % CACHE_LINE_BYTES
    copy = raw[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    np.copyto(copy, array)
    return copy


_NEGATIVE_POWER = "numba runtime: an int raised to a negative power"


def _launch(runtime: NumbaRuntime, kernel, arrays: list[np.ndarray], outputs: list[np.ndarray],
            tail: list, parts: int, calls: int) -> bool:  # fmt: skip
    """Calls ``kernel`` ``calls`` times over ``parts`` slices, each call claiming slices
    until none is left (``numba_source``); returns whether NumPy would have raised (an int
    raised to a negative power)."""
    err = claims(calls)  # [NumPy would raise, the next slice to claim]
    args = [a.reshape(-1) for a in arrays] + [o.reshape(-1) for o in outputs] + [*tail, err]
    _run_parts(kernel, args, parts, calls, calls=calls)
    runtime.stats.launches += 1
    return bool(err[0])


def claims(calls: int) -> np.ndarray:
    """The counter of a launch whose ``calls`` calls each run their own slice and then claim
    the slices above them (``numba_math.next_part``) until none is left: ``[0, calls]``,
    the next slice to claim in its second element (its first is free for a flag)."""
    counter = np.zeros(2, np.int64)
    counter[1] = calls
    return counter


_MAX_THREADS = os.cpu_count() or 1
_LINGER_SECONDS = 5e-6
"""How long a worker that saw a launch waits before taking the GIL: the caller lets it go
when it enters its own part, a few microseconds after posting the launch (measured on 2
vCPUs, back-to-back launches of 20 us parts: 41-52 us without it, 29-46 us with 5 us,
34-54 us with 10 us)."""
_WAIT_ROUNDS = 100_000  # checks of a caller's spell of waiting for workers (some ms)


class _Job:
    """One launch: its kernel and arguments, the counter its calls are claimed from, and
    the errors of calls that workers ran. Call ``i`` of ``calls`` runs
    ``kernel(*args, i, parts)``: part ``i``, and for a kernel that claims further parts
    itself (``numba_source``) those too."""

    __slots__ = ("args", "calls", "claims", "errors", "kernel", "parts")

    def __init__(self, kernel, args: list, parts: int, calls: int) -> None:
        self.kernel, self.args, self.parts, self.calls = kernel, args, parts, calls
        self.claims = itertools.count()  # next() is atomic under the GIL
        self.errors: list[BaseException] = []

    def claim(self) -> int | None:
        """An unclaimed call, or None when every call is taken."""
        part = next(self.claims)
        return part if part < self.calls else None


class _Count:
    """A count a launch adds to and sleeping workers take from, one unit each, blocking in
    a system call that releases the GIL: an eventfd where the OS has one, else a pipe (a
    byte per unit). A pipe's writer wakes the reader as a "sync" wake-up, which Linux may
    answer by queueing the reader on the writer's own core, where the writer keeps running
    its part; an eventfd's wake-up carries no such hint."""

    def __init__(self) -> None:
        self._eventfd = hasattr(os, "eventfd")
        if self._eventfd:
            self._fd = os.eventfd(0, os.EFD_SEMAPHORE)
        else:  # platforms without eventfd
            self._read, self._write = os.pipe()

    def add(self, n: int) -> None:
        if self._eventfd:
            os.eventfd_write(self._fd, n)
        else:
            os.write(self._write, b"x" * n)

    def take(self) -> None:
        """Waits until the count is above 0, then takes 1 from it."""
        if self._eventfd:
            os.eventfd_read(self._fd)
        else:
            os.read(self._read, 1)


class _Workers:
    """Persistent worker threads that run parts of kernels beside the calling thread.

    The parts of a launch are claimed from a shared counter, the caller's part 0 first, so
    a part nobody has claimed when the caller is done runs on the caller: a worker that a
    loaded machine wakes late costs nothing but the part it took. A launch posts its job
    and bumps a counter; a worker that ran parts reports them on another counter and then
    watches the first for a short while, both without the GIL (``numba_spin``), before it
    sleeps on a :class:`_Count`; the caller waits for the reports without the GIL too.
    Nothing sleeps while kernels follow each other, since on a virtual machine a thread
    woken from sleep starts 25-150 us late (an idle vCPU halts), and a thread that finds
    the GIL taken sleeps on it; and nothing spins for long beside BLAS threads, which spin
    too. Measured on 2 cores: a launch round trip of about 5 us to a sleeping worker,
    where a ``ThreadPoolExecutor`` (condition variables) took 17-18 us.
    """

    def __init__(self, count: int) -> None:
        from ember.backends.fusion import numba_spin

        self.count = count
        self._wake = _Count()
        self._job: _Job | None = None
        self.busy = threading.Lock()  # one launch at a time uses the workers
        # [launches so far (what waiting workers watch), parts the workers ran this launch]
        self._counters = np.zeros(2, np.int64)
        self._posted = self._counters.ctypes.data
        self._reported = self._posted + 8
        self._sleepers = 0  # workers asleep on _wake that no launch has woken yet
        self._lock = threading.Lock()
        self._spin = numba_spin
        self._rounds = numba_spin.rounds_for(numba_spin.spin_seconds(), self._posted, 0)
        self._linger = int(self._rounds * _LINGER_SECONDS / max(numba_spin.spin_seconds(), 1e-9))
        for i in range(count):
            threading.Thread(target=self._serve, name=f"ember-fusion-{i}", daemon=True).start()

    def _serve(self) -> None:
        seen, ran = 0, 0
        while True:
            woken = self._spin.report_and_wait(self._reported, ran, self._posted, seen,
                                               self._rounds, self._linger)  # fmt: skip
            if not woken:
                with self._lock:
                    asleep = int(self._counters[0]) == seen
                    self._sleepers += int(asleep)
                if asleep:
                    self._wake.take()
            seen, ran = int(self._counters[0]), 0
            job = self._job  # None, or a later job, when woken late: harmless either way
            while job is not None and (part := job.claim()) is not None:
                try:
                    job.kernel(*job.args, part, job.parts)
                except BaseException as error:  # the caller raises it
                    job.errors.append(error)
                ran += 1
            # Waiting, hold nothing: the job's arrays (a kernel's output among them) go back
            # to the buffer pool only when nothing refers to them.
            job = None

    def run(self, kernel, args: list, parts: int, calls: int | None = None) -> None:
        """Makes the calls of a launch (see :class:`_Job`; ``calls`` defaults to
        ``parts``) on this thread and the workers."""
        calls = parts if calls is None else calls
        job = _Job(kernel, args, parts, calls)
        job.claim()  # call 0 is the caller's
        self._job = job
        with self._lock:
            self._counters[0] += 1
            woken = min(calls - 1, self._sleepers)
            self._sleepers -= woken
        if woken:
            self._wake.add(woken)
        mine = 1  # calls the caller claimed
        try:
            kernel(*args, 0, parts)
            while (part := job.claim()) is not None:
                mine += 1
                kernel(*args, part, parts)
        finally:
            while job.claim() is not None:  # after an error: leave the workers nothing new
                mine += 1
            # A worker reports the parts it ran when it is done with the launch. Between
            # spells of spinning, a KeyboardInterrupt can land.
            while not self._spin.wait_until(self._reported, calls - mine, _WAIT_ROUNDS):
                time.sleep(0)
            self._job = None
            with self._lock:  # its release orders this before the next launch's post
                self._counters[1] = 0
        if job.errors:
            raise job.errors[0]


_workers: _Workers | None = None
_workers_lock = threading.Lock()


def _reset_after_fork() -> None:
    # A forked child has none of the parent's threads: it starts its own when it needs them.
    global _workers, _workers_lock
    _workers, _workers_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def parts_for(work: int, minimum: int, threads: int | None) -> int:
    """How many parts a single-op kernel (convolution, pooling, matmul) runs in: ``threads``
    when given; one below ``minimum`` units of ``work`` (waking threads costs more); else
    ``EMBER_FUSION_THREADS`` or every core."""
    if threads:
        return max(1, threads)
    if work < minimum:
        return 1
    return count("EMBER_FUSION_THREADS", "threads") or _MAX_THREADS


def _parts(threads: int, elements: int) -> int:
    """How many parts a run of a block of ``elements`` on ``threads`` threads is split
    into: up to :data:`PARTS_PER_THREAD` a thread, of at least :data:`PART_ELEMENTS` each.
    Parts are claimed as threads come free, so where a worker wakes late (tens of
    microseconds, hundreds after a long idle) the caller takes more of them instead of
    waiting for the worker's half: layer norm over ``[4096, 1024]`` at two threads
    measured 3.3-4.4 -> 3.0-3.1 ms, softmax 4.6-4.8 -> 4.0-4.2 (one part a thread against
    eight, two runs)."""
    if threads <= 1:
        return 1
    return threads * max(1, min(PARTS_PER_THREAD, elements // (threads * PART_ELEMENTS)))


def _compiles(dispatcher) -> tuple[int, int]:
    """How many signatures ``dispatcher`` holds, and how many of them came from disk."""
    return len(dispatcher.overloads), sum(dispatcher.stats.cache_hits.values())


def _run_parts(kernel, args: list, parts: int, threads: int | None = None,
               calls: int | None = None) -> None:  # fmt: skip
    """Runs ``kernel`` over ``parts`` slices of its tasks on ``threads`` threads (default:
    one a call): ``kernel(*args, part, parts)`` for each part below ``calls`` (default
    ``parts``; a kernel that claims the parts above it itself is called once a thread), on
    numba's own threads where ``numba_parallel`` can, else call 0 on the calling thread
    and the others on whichever of the calling thread and the runtime's worker threads
    claims them first (kernels release the GIL). Idle workers sleep in a blocking read
    after a short spin: a worker spinning long between kernels would take a core from BLAS
    threads, which spin too. A second thread launching while the workers are busy makes
    all its calls itself."""
    calls = parts if calls is None else min(calls, parts)
    if calls == 1:
        kernel(*args, 0, parts)
        return
    if numba_parallel.enabled() and numba_parallel.run(kernel, args, parts, threads or calls,
                                                       calls):  # fmt: skip
        return
    global _workers
    if _workers is None:
        with _workers_lock:
            if _workers is None:
                _workers = _Workers(_MAX_THREADS - 1)
    workers = _workers
    if not workers.busy.acquire(blocking=False):
        for part in range(calls):
            kernel(*args, part, parts)
        return
    try:
        workers.run(kernel, args, parts, calls)
    finally:
        workers.busy.release()


def _writes_safely(block: ir.Block, outputs: list[np.ndarray], inputs: list[np.ndarray]) -> bool:
    """Whether the kernel may write ``outputs`` where it runs over ``inputs``: where no
    output shares memory with an input, or, for an element-wise block, where each shared
    one is exactly that input (each position is read before it is written)."""
    for o in outputs:
        for a in inputs:
            if not np.may_share_memory(o, a):
                continue
            same = (block.axis is None and o.shape == a.shape and o.strides == a.strides
                    and o.__array_interface__["data"][0] == a.__array_interface__["data"][0])  # fmt: skip
            if not same:
                return False
    return True


def _numpy_dtype(dtype: DType) -> np.dtype:
    found = _NUMPY_DTYPES.get(dtype)
    if found is None:
        name = dtype.name.replace("F", "float").replace("I", "int").replace("U", "uint").lower()
        found = _NUMPY_DTYPES[dtype] = np.dtype(np.bool_ if dtype is DType.BOOL else name)
    return found


_NUMPY_DTYPES: dict[DType, np.dtype] = {}  # a launch asks for each input's and output's


def _memory_order(block: ir.Block, inputs: list) -> tuple[int, ...] | None:
    """The order of dims in which every full-size input of an element-wise ``block`` is
    C-contiguous, where they are all permuted alike (none is C-contiguous as it stands);
    None otherwise, or where an instruction has an attribute tied to dims."""
    if block.axis is not None or len(block.shape) < 2:
        return None
    order = None
    for array in inputs:
        if type(array) is not np.ndarray:
            return None
        if array.shape != block.shape or array.size <= 1:
            continue
        if array.flags.c_contiguous:
            return None
        dims = sorted(range(array.ndim - 1), key=lambda d: -array.strides[d]) + [array.ndim - 1]
        if not array.transpose(dims).flags.c_contiguous or order not in (None, dims):
            return None
        order = dims
    if order is None or any(type(a) in (tuple, list) for i in block.body for a in i.attrs):
        return None
    return tuple(order)


def _permuted(block: ir.Block, order: tuple[int, ...]) -> ir.Block:
    """``block`` over its dims in ``order`` (element-wise: no attribute names a dim)."""

    def permute(shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(shape[d] for d in order)

    return ir.Block(permute(block.shape), tuple(ir.Input(permute(i.shape), i.dtype)
                                                for i in block.inputs),
                    tuple(ir.Instr(i.op, i.args, i.attrs, permute(i.shape), i.dtype)
                          for i in block.body), block.outputs)  # fmt: skip


def _broadcast_views(block: ir.Block, inputs: list) -> tuple[ir.Block, list]:
    """``block`` and ``inputs`` with each broadcast view among the inputs (an ``expand``:
    stride 0 along dims of more than one element) handed over as the single copy it
    repeats, the block's input 1 along those dims: the kernel then reads it as any
    broadcast input (a bias), where a contiguous copy would write out every repeat first."""
    specs = None
    for i, array in enumerate(inputs):
        if type(array) is not np.ndarray or array.flags.c_contiguous or 0 not in array.strides:
            continue
        spec = block.inputs[i]
        if array.shape != spec.shape:
            continue  # _inputs names the mismatch
        one = array[tuple(slice(0, 1) if stride == 0 else slice(None) for stride in array.strides)]
        if specs is None:
            specs, inputs = list(block.inputs), list(inputs)
        specs[i], inputs[i] = ir.Input(one.shape, spec.dtype), one
    if specs is None:
        return block, inputs
    # Kept on the block, as its launch is (``_launch_data``): a new block each call would
    # look its kernel up and work its launch out again (about 70 us a call in a step).
    made = block.__dict__.setdefault("_broadcast_blocks", {})
    specs = tuple(specs)
    found = made.get(specs)
    if found is None:
        if len(made) >= _BROADCAST_BLOCKS:
            made.clear()
        found = made[specs] = ir.Block(block.shape, specs, block.body, block.outputs, block.axis)
    return found, inputs


_BROADCAST_BLOCKS = 8  # a block's broadcast variants kept (each input expanded or not)


def _inputs(block: ir.Block, inputs: list[np.ndarray],
            take: Callable) -> tuple[list[np.ndarray], list[np.ndarray]]:  # fmt: skip
    """The kernel's input arrays, and those of them that are copies (of views that are not
    C-contiguous) in buffers from ``take``, the pool's, to give back after the launch (as
    the pool's outputs: no fresh pages to fault in)."""
    if len(inputs) != len(block.inputs):
        raise ShapeError(f"numba runtime: {len(inputs)} inputs for a block of {len(block.inputs)}")
    arrays, copies = [], []
    for i, (array, spec) in enumerate(zip(inputs, block.inputs)):
        array = np.asarray(array)
        if array.shape != spec.shape or array.dtype != _numpy_dtype(spec.dtype):
            raise ShapeError(
                f"numba runtime: input {i} must be {spec.dtype} {fmt_shape(spec.shape)}, "
                f"got {array.dtype} {fmt_shape(array.shape)}"
            )
        if not array.flags.c_contiguous:
            # A transposed view (a gradient through a transpose) is copied tile by tile:
            # NumPy's copy reads it an element per cache line (2.5 ms for 512k floats
            # against 1.4).
            array = layout.contiguous(array, out=take(array.shape, array.dtype))
            copies.append(array)
        arrays.append(array)
    return arrays, copies


def _scalar(value: int | float | bool, dtype: np.dtype) -> Any:
    """A scalar argument as the kernel's type; an int that does not fit the tensor's dtype
    is refused (NumPy raises for it), so the unfused op raises NumPy's error."""
    if dtype.kind in "iu" and not isinstance(value, bool):
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise KernelUnsupported(f"numba runtime: scalar {value} does not fit {dtype}")
    return dtype.type(value)
