"""Running a kernel's parts on numba's own threads (its OpenMP or TBB threading layer).

Every kernel of the numba runtime takes ``part, parts`` and computes that slice of its
tasks (``numba_runtime._run_parts``). The runtime's worker threads (``_Workers``) are
Python threads: each part they run is a call into numba, which needs the GIL, and the
thread that launches holds the GIL until it enters its own part. So a worker that sees a
launch waits for the GIL, falls asleep on it, and starts its part 35-150 us late on a
virtual machine (measured on 2 vCPUs: a median of 35 us). A parallel numba function
(``parallel=True``, ``prange`` over the parts) runs the parts on threads of numba's
threading layer instead, which never take the GIL, and which spin a while between
launches: measured on 2 vCPUs, alternating in one process, the ONNX CNN's replayed forward
took 4.70 against 5.01 ms with its convolutions launched this way, and the transformer
training step (``nn_step``, replayed) 111.0 against 115.6 ms with every launch this way
(128.3 against 135.1 ms in a busier minute). Launching only some kernels this way was
slower than either: the two pools of threads took each other's cores.

**The launcher of a kernel** is generated as a module file beside the runtime's kernels
(``cache_folder.cache_dir()/parallel/p_<digest>.py``) that loops ``prange`` over the calls
and calls the kernel at the address of its machine code (``call_at``), given as its
first argument; numba's disk cache keeps the launcher's own code, so a new process loads
it. The launcher holds none of the kernel's code: linking the kernel in by name had LLVM
optimize the kernel again inside every launcher (3-4 s a GEMM launcher, against 0.3 s),
and a cached launcher could have kept an old kernel's code. ``<digest>`` covers this
file (``call_at``'s code). The address comes from the kernel's overload that numba's
dispatch picks for the arguments, kept by their fingerprints; a kernel with no code for
them yet runs on the workers (its call compiles it) while its launcher is asked for. A
kernel that is not its module's attribute of its own name (made at run time) is launched
by the workers.

**Threads.** A launch of ``calls`` calls (``kernel(*args, part, parts)`` for each part
below ``calls``: every part, or one a thread for a kernel that claims the others itself)
on ``threads`` threads runs on ``min(threads, NUMBA_NUM_THREADS)`` of numba's threads;
calls beyond one a thread are handed out one at a time as threads come free (numba's
parallel chunk size 1), as the workers claim them.

**Compiles.** A launcher takes about 0.3 s to compile for each kernel and signature
(numba's parallel pipeline; 1-4 s while it compiled the kernel into itself: the
transformer training step's first call then took 38 s with an empty cache in this
process, against 6.7 s on the workers). So this process never compiles one. A signature
it lacks is loaded from numba's disk cache where it is there (about 10 ms), else asked of
a compiler process of its own (``serve``, started on first need at a lower priority),
which compiles it into the disk cache; the kernel's launches run on the workers until it
is loaded.

**On by default** since generated kernels claim their slices themselves
(``numba_source``): a launch is then one call a thread, where numba's threads had
scheduled the parts one by one, and the small kernels that used to lose here gain too.
Measured on 2 vCPUs at two threads, in alternating processes (``EMBER_FUSION_WORKERS``
``numba`` against ``ember``): the transformer training step (``nn_step``) 1.035-1.050x
torch against 1.092-1.094x, the guide CNN's step 0.64-0.66x (replayed 0.53-0.54x) against
0.69x (0.58x), the ONNX CNN 1.29-1.35x onnxruntime against 1.38-1.42x and the ONNX encoder
1.11-1.16x against 1.18-1.20x in the same two runs (1.17-1.22x against 1.07-1.09x in two
earlier ones). ``EMBER_FUSION_WORKERS=ember`` keeps every launch on the runtime's own
workers (the test suites do: a compiler process per test worker would compete with the
tests). Launches also stay on the workers where numba's threading layer is not one that
takes launches from several threads at once (OpenMP or TBB: its ``workqueue`` layer aborts
the process instead) or was set to another by the user, in forked children (GNU OpenMP's
threads do not survive a fork), and for a launcher the compiler process could not
compile.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ember.backend.errors import ConfigError

try:  # numba is optional: the runtime checks it before launching anything
    import numba
    from llvmlite import ir as llvm_ir
    from numba.core import callconv, cgutils, types
    from numba.core.dispatcher import _dispatcher
    from numba.extending import intrinsic
    from numba.np.ufunc import parallel as _layer

    _fingerprint = _dispatcher.compute_fingerprint
except ImportError:  # pragma: no cover - exercised where numba is missing
    numba = _layer = None

    def intrinsic(function: Any) -> Any:
        return function

__all__ = ["enabled", "launcher", "loads", "run", "serve", "wait"]

_SAFE_LAYERS = ("omp", "tbb")  # layers that take launches from several threads at once
_TEMPLATE = """\
# A launcher generated by ember.backends.fusion.numba_parallel: do not edit.
# It runs {module}.{name}, called at the address of its machine code (call_at).
import numba

from ember.backends.fusion.numba_parallel import call_at


@numba.njit(nogil=True, parallel=True, cache=True)
def launch(address, {args}, calls, parts):
    for part in numba.prange(calls):
        call_at(address, ({args}, part, parts))
"""
# The launchers' machine code follows this file (call_at's code among it).
_VERSION = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]

_state = {"enabled": None, "loads": 0}  # enabled None: not decided yet in this process
_lock = threading.Lock()
_launchers: dict[tuple[Any, int], Any] = {}  # (kernel, argument count) -> launcher or None
_addresses: dict[tuple, tuple] = {}  # (kernel, arguments' fingerprints) -> _address's
MAX_ADDRESSES = 4096


def _setting() -> str:
    value = os.environ.get("EMBER_FUSION_WORKERS", "numba").strip().lower() or "numba"
    if value not in ("numba", "ember"):
        raise ConfigError(f"EMBER_FUSION_WORKERS={value!r}: expected 'numba' (numba's "
                          "threading layer where it can, the default) or 'ember' (the "
                          "runtime's own worker threads)")  # fmt: skip
    return value


def enabled() -> bool:
    """Whether multi-part launches run on numba's threads in this process (see the module
    doc); decided on the first call.

    Raises:
        ConfigError: ``EMBER_FUSION_WORKERS`` is neither ``numba`` nor ``ember``.
    """
    decided = _state["enabled"]
    if decided is not None:
        return decided
    with _lock:
        if _state["enabled"] is None:
            _state["enabled"] = _setting() == "numba" and _layer_is_safe()
        return _state["enabled"]


def _layer_is_safe() -> bool:
    """Whether numba's threading layer takes launches from several threads at once,
    choosing one that does where the user left numba's choice open."""
    if numba is None or not hasattr(numba, "set_parallel_chunksize"):
        return False
    try:
        from numba.np.ufunc import parallel

        if not parallel._is_initialized:  # numba starts its threads on the first launch
            layer = numba.config.THREADING_LAYER
            if layer == "default":
                numba.config.THREADING_LAYER = "threadsafe"
            elif layer not in (*_SAFE_LAYERS, "threadsafe", "safe"):
                return False
            try:
                parallel._launch_threads()
            except (ValueError, ImportError, OSError):  # no such layer here
                numba.config.THREADING_LAYER = layer
                return False
        return numba.threading_layer() in _SAFE_LAYERS
    except (AttributeError, ImportError, ValueError):  # another numba's internals
        return False


def _after_fork_in_child() -> None:
    # GNU OpenMP's threads are not there in a forked child, and its pool cannot be
    # started again: the child launches on the runtime's own workers.
    _state["enabled"] = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def loads() -> int:
    """How many launchers or signatures this process has loaded so far: each takes 10-170
    ms, once, inside the launch that first needs it, so a run that loaded one is not a
    timing of the kernel (the tuner runs it again: ``autotune``)."""
    return _state["loads"]


def launcher(kernel: Any, nargs: int) -> Any:
    """The parallel launcher of ``kernel`` (a numba dispatcher taking ``nargs`` arguments,
    then ``part, parts``), or None where it has none (see the module doc)."""
    key = (kernel, nargs)
    found = _launchers.get(key, False)
    if found is not False:
        return found
    with _lock:
        found = _launchers.get(key, False)
        if found is False:
            found = _launchers[key] = _make(kernel, nargs)
            _state["loads"] += found is not None
    return found


def _make(kernel: Any, nargs: int) -> Any:
    from ember.backends.fusion.cache_folder import cache_dir
    from ember.backends.fusion.numba_runtime import load_generated

    function = getattr(kernel, "py_func", None)
    module = sys.modules.get(getattr(function, "__module__", None) or "")
    name = getattr(function, "__name__", "")
    if function is None or module is None or getattr(module, name, None) is not kernel:
        return None
    args = ", ".join(f"a{i}" for i in range(nargs))
    source = _TEMPLATE.format(module=module.__name__, name=name, args=args)
    key = hashlib.sha256(f"{_VERSION}\0{module.__name__}\0{source}".encode())
    loaded = load_generated(cache_dir() / "parallel", f"p_{key.hexdigest()[:24]}", source,
                            "ember_fusion_launchers")  # fmt: skip
    launch = loaded.launch
    launch._can_compile = False  # compiled by the compiler process only (see run)
    _origins[launch] = (loaded.__name__, loaded.__file__)  # what the compiler imports
    return launch


def run(kernel: Any, args: list, parts: int, threads: int, calls: int | None = None) -> bool:
    """Runs ``kernel``'s calls ``kernel(*args, part, parts)``, one for each part below
    ``calls`` (default ``parts``: see ``numba_runtime._run_parts``), on ``threads`` of
    numba's threads; False, running nothing, where the kernel has no launcher or none
    compiled for these arguments yet (then its compile is asked of the compiler process:
    see the module doc). The caller's workers run the calls then."""
    calls = parts if calls is None else calls
    launch = launcher(kernel, len(args))
    if launch is None or launch in _pending or launch in _broken:
        return False
    address, kernel_types = _address(kernel, args)
    if address is None:  # no code for these arguments yet: the workers' call compiles it,
        _loaded(launch, kernel_types)  # and the compiler process the launcher meanwhile
        return False
    if _compiled:
        _load_compiled(launch)
    threads = max(1, min(threads, calls, numba.config.NUMBA_NUM_THREADS))
    if _thread_setting() != threads:  # a setting of the calling thread
        numba.set_num_threads(threads)
    previous = numba.set_parallel_chunksize(1) if calls > threads else None
    try:
        try:
            launch(address, *args, calls, parts)
        except TypeError:  # no signature for these arguments in this process: nothing ran
            # Worked out anew: a fingerprint does not tell an unaligned array from an
            # aligned one, which numba types apart.
            address, kernel_types = _address(kernel, args, kept=False)
            if address is None or not _loaded(launch, kernel_types):
                return False
            try:
                launch(address, *args, calls, parts)
            except TypeError:  # still none that takes them: the workers run the kernel
                return False
    finally:
        if previous is not None:
            numba.set_parallel_chunksize(previous)
    return True


def _loaded(launch: Any, kernel_types: tuple | None) -> bool:
    """Whether ``launch`` has its signature for a kernel taking ``kernel_types`` now
    (loaded from numba's disk cache); where not, it is asked of the compiler process."""
    if kernel_types is None:
        return False
    signature = (numba.types.int64, *kernel_types)
    if _load(launch, signature, only_from_disk=True):
        return True
    _ask(launch, signature)
    return False


def _address(kernel: Any, args: list, kept: bool = True) -> tuple[int | None, tuple | None]:
    """``(address, types)``: where ``kernel``'s machine code for ``args`` (then ``part,
    parts``) starts, which a launcher calls, and the argument types that code takes (the
    overload numba's dispatch picks: an explicit signature of ``A`` layout takes ``C``
    arrays). Where it has no code for them yet, ``(None, types)`` with the types it will
    be compiled for (the arguments' own); ``(None, None)`` where numba cannot tell. Kept by
    the arguments' fingerprints (numba's own fast key of their types: about 1 us for six
    arrays); ``kept=False`` works it out from their types and keeps nothing."""
    key = None
    if kept:
        try:
            key = (kernel, *map(_fingerprint, args))
        except (TypeError, ValueError, NotImplementedError):  # typed below, each time
            key = None
    found = _addresses.get(key) if key is not None else None
    if found is not None:
        return found
    int64 = numba.types.int64
    try:
        wanted = (*[numba.typeof(a) for a in args], int64, int64)
        chosen = kernel.typingctx.resolve_overload(
            kernel.py_func, kernel.nopython_signatures, wanted, {}, allow_ambiguous=False)
    except Exception:  # another numba's internals, or no overload takes them
        return None, None
    compiled = None if chosen is None else kernel.overloads.get(tuple(chosen.args))
    if compiled is None:
        return None, wanted
    address = compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name)
    found = (address, tuple(chosen.args))
    if key is not None:
        if len(_addresses) >= MAX_ADDRESSES:
            _addresses.clear()
        _addresses[key] = found
    return found


@intrinsic
def call_at(typingctx, address, arguments):
    """Calls the numba function whose machine code is at ``address`` (an int) with the
    tuple ``arguments``, by numba's calling convention, its status ignored (the runtime's
    kernels do not raise): how a launcher calls its kernel without holding its code
    (module doc)."""
    signature = types.none(address, arguments)

    def codegen(context, builder, sig, llargs):
        address, packed = llargs
        argument_types = list(sig.args[1].types)
        values = [builder.extract_value(packed, i) for i in range(len(argument_types))]
        convention = context.call_conv
        function = convention.get_function_type(types.none, argument_types)
        pointer = builder.inttoptr(address, function.as_pointer())
        returned = cgutils.alloca_once(builder, convention.get_return_type(types.none).pointee)
        builder.store(cgutils.get_null_value(returned.type.pointee), returned)
        error = cgutils.alloca_once(builder, llvm_ir.PointerType(callconv.excinfo_t))
        flat = list(convention._get_arg_packer(argument_types).as_arguments(builder, values))
        builder.call(pointer, [returned, error, *flat])
        return context.get_dummy_value()

    return signature, codegen


def _thread_setting() -> int:
    """``numba.get_num_threads()``, read from the threading layer itself once it is up:
    numba's function takes its initialization locks first, 1.5 us a launch here against
    0.2 (a launch is often 10-50 us of work)."""
    read = getattr(_layer, "_get_num_threads", None)
    if getattr(_layer, "_is_initialized", False) and read is not None:
        threads = read()
        if threads > 0:
            return threads
    return numba.get_num_threads()


# ---------------------------------------------------------------- the compiler process
# numba compiles one function at a time, process-wide, and a launcher takes 1-4 s: in this
# process, a model's own first compiles would wait behind them (measured: a first step of
# 13-18 s against 7 s, compiling on a thread of this process). A process of its own, at a
# lower priority, compiles them into the disk cache, from which this process loads each
# in about 10 ms; the launches run on the workers meanwhile.
_origins: dict = {}  # launcher -> (its module's name, its file)
_pending: set = set()  # launchers with a compile asked and not answered
_broken: set = set()  # launchers that failed to compile: the workers run their kernels
_compiled: dict = {}  # launcher -> signatures compiled on disk, not loaded here yet
_asked: dict[int, tuple] = {}  # request number -> (launcher, signature)
_compiler: dict = {"process": None, "numbers": 0}


def _ask(launch: Any, signature: tuple) -> None:
    """Asks the compiler process for ``launch`` at ``signature`` (started on first use)."""
    with _lock:
        if launch in _pending:
            return
        process = _compiler["process"]
        if process is None or process.poll() is not None:
            process = _compiler["process"] = _start_compiler()
            if process is None:
                _broken.add(launch)
                return
        number = _compiler["numbers"] = _compiler["numbers"] + 1
        payload = pickle.dumps((number, *_origins[launch], signature))
        try:
            process.stdin.write(struct.pack("<I", len(payload)) + payload)
            process.stdin.flush()
        except OSError:  # the process is gone: launches stay on the workers
            _broken.add(launch)
            return
        _asked[number] = (launch, signature)
        _pending.add(launch)


def _start_compiler() -> subprocess.Popen | None:
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", "from ember.backends.fusion.numba_parallel import serve; serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)  # fmt: skip
    except OSError:
        return None
    threading.Thread(target=_answers, args=(process,), name="ember-fusion-compiler",
                     daemon=True).start()  # fmt: skip
    return process


def _answers(process: subprocess.Popen) -> None:
    """Takes the compiler process's answers (``<number> ok|failed`` lines) until it ends."""
    for line in process.stdout:
        number, _, answer = line.decode(errors="replace").partition(" ")
        with _lock:
            if not number.isdigit() or int(number) not in _asked:
                continue  # not an answer (something the process printed)
            launch, signature = _asked.pop(int(number))
            _pending.discard(launch)
            if answer.strip() == "ok":
                _compiled.setdefault(launch, []).append(signature)
            else:
                _broken.add(launch)
    with _lock:  # it ended: what it had not answered stays on the workers
        for launch, _ in _asked.values():
            _pending.discard(launch)
            _broken.add(launch)
        _asked.clear()


def _load_compiled(launch: Any) -> None:
    """Loads the signatures of ``launch`` the compiler process wrote to the disk cache."""
    with _lock:
        signatures = _compiled.pop(launch, ())
    for signature in signatures:
        if not _load(launch, signature):
            _broken.add(launch)


def _load(launch: Any, signature: tuple, only_from_disk: bool = False) -> bool:
    """Whether ``launch`` has ``signature`` now: loaded from numba's disk cache (a process
    that compiled it before, or the compiler process), else compiled here, unless
    ``only_from_disk``."""
    try:
        if only_from_disk and launch._cache.load_overload(signature, launch.targetctx) is None:
            return False
        launch._can_compile = True
        launch.compile(signature)  # from the disk cache where it is there
        _state["loads"] += 1
        return True
    except Exception:  # another numba's internals, or a launcher numba cannot compile
        return False
    finally:
        launch._can_compile = False


def wait() -> bool:
    """Waits until the compiler process answered every launcher asked of it (tests; a
    benchmark before it times); returns whether any was asked and not answered."""
    waited = bool(_pending)
    while _pending:
        time.sleep(0.02)
    return waited


def serve() -> None:
    """The compiler process: compiles each launcher asked on standard input (length-prefixed
    pickles from the process that started it) into numba's disk cache, answering
    ``<number> ok`` or ``<number> failed`` on standard output."""
    from ember.backends.fusion import numba_target  # noqa: F401  the same vector width
    from ember.backends.fusion.numba_runtime import import_file

    if hasattr(os, "nice"):
        os.nice(10)  # the process that asked trains meanwhile: it goes first
    source, answers = sys.stdin.buffer, sys.stdout
    while len(header := source.read(4)) == 4:
        (size,) = struct.unpack("<I", header)
        number, module, file, signature = pickle.loads(source.read(size))
        try:
            import_file(Path(file), module).launch.compile(signature)
            answer = "ok"
        except Exception:
            answer = "failed"
        answers.write(f"{number} {answer}\n")
        answers.flush()
