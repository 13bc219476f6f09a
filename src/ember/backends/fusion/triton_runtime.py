"""The Triton runtime: compiles an ``ir.Block`` to a GPU kernel and runs it on torch tensors.

Triton is optional (``pip install 'ember[gpu-jit]'``). Importing this module never fails;
:func:`unavailable_reason` says why the runtime cannot run here (no triton, or no CUDA GPU
and Triton's interpreter off), and :class:`TritonRuntime` raises
:class:`~ember.backend.errors.BackendUnavailableError` with that reason.

**Where it runs.** On CUDA tensors; with ``TRITON_INTERPRET=1`` (Triton's interpreter,
which runs a kernel's programs with NumPy) on CPU tensors instead: that is how every
generated kernel kind is tested without a GPU. The interpreter is read when the runtime is
made, as Triton reads it when a kernel is decorated.

**Compiling.** The kernel source (``triton_source``, or ``triton_matmul`` for a matmul
with an epilogue) is written as a module file ``t_<hash>.py`` into ``<fusion cache>/
triton/`` (Triton's ``jit`` reads a kernel's source from its file), ``<hash>`` covering
the key and the generators' own sources. Within a process kernels are kept by key; across
processes Triton's own cache keeps the compiled binaries, which this runtime points at
``<fusion cache>/triton/compiled`` unless ``TRITON_CACHE_DIR`` says otherwise. Code runs
from those folders only while no other user can write them (``cache_folder``).

**Running.** Inputs may be any torch tensors of the block's shapes and dtypes on the
runtime's device: non-contiguous ones are copied to contiguous ones first (the kernel
sees flat memory). Outputs are fresh ``torch.empty`` tensors (torch's caching allocator
is the buffer pool here) or the tensors of ``out``.

**Launch configurations** (``BLOCK``, ``num_warps``, ``num_stages``) are candidates of
the fusion tuner (``autotune.Tuner``), beside the unfused ops: :meth:`TritonRuntime.configs`
lists them per kernel kind, a run names one by its label, and the tuner times them per
(kernel key, size bucket) and persists the choice in ``autotune-<gpu>.json`` of this
runtime's cache folder. Under the interpreter nothing is tuned (``tunes`` is False: its
timings say nothing about a GPU) and each kernel kind runs its first configuration.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import math
import os
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ember.atomic import atomic_write
from ember.backend.errors import BackendUnavailableError, ShapeError, fmt_shape
from ember.backends.fusion import ir
from ember.backends.fusion.cache_folder import cache_dir, check_module, code_folder
from ember.backends.fusion.triton_source import TL_DTYPES, KernelUnsupported

try:  # triton is optional: everything below that needs it checks available() first
    import triton
except ImportError:  # pragma: no cover - exercised where triton is missing
    triton = None

__all__ = ["Config", "KernelUnsupported", "TritonRuntime", "available", "unavailable_reason"]

_HERE = Path(__file__).parent
_GENERATOR_FILES = ("triton_source.py", "triton_matmul.py", "numba_source.py", "ir.py")
WIDE = 1 << 31
"""Blocks of this many elements or more index in int64."""


def available() -> bool:
    """Whether triton is installed."""
    return triton is not None


def interpreting() -> bool:
    """Whether Triton's interpreter is on (``TRITON_INTERPRET=1``): kernels then run on CPU
    tensors."""
    if triton is None:
        return False
    try:
        return bool(triton.knobs.runtime.interpret)
    except AttributeError:  # pragma: no cover - a triton without knobs
        return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def unavailable_reason() -> str | None:
    """Why the runtime cannot run here (None when it can)."""
    if triton is None:
        return ("fusion: the triton runtime needs triton; install the extra: "
                "pip install 'ember[gpu-jit]'")  # fmt: skip
    if interpreting():
        return None
    import torch

    if not torch.cuda.is_available():
        return ("fusion: the triton runtime needs a CUDA GPU and torch sees none "
                "(torch.cuda.is_available() is False); TRITON_INTERPRET=1 runs its kernels "
                "in Triton's interpreter on CPU tensors instead (slow: for tests)")  # fmt: skip
    return None


def _generator_version() -> str:
    digest = hashlib.sha256()
    for name in _GENERATOR_FILES:
        digest.update((_HERE / name).read_bytes())
    if triton is not None:
        digest.update(triton.__version__.encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Config:
    """A launch configuration: ``block`` elements per program (element-wise), per chunk of
    the axis (reductions), or ``(bm, bn, bk)`` tiles (matmul); ``warps``, ``stages``."""

    block: int | tuple[int, int, int]
    warps: int
    stages: int = 1

    @property
    def label(self) -> str:
        """The name a tuner's choice file stores (``b1024w4s1``, ``m64x64x32w4s3``)."""
        if isinstance(self.block, tuple):
            return f"m{'x'.join(map(str, self.block))}w{self.warps}s{self.stages}"
        return f"b{self.block}w{self.warps}s{self.stages}"


ELEMENTWISE_CONFIGS = (Config(1024, 4), Config(4096, 8), Config(512, 4), Config(2048, 4))
REDUCTION_CONFIGS = (Config(1024, 4), Config(4096, 8), Config(256, 2), Config(2048, 8))
MATMUL_CONFIGS = (Config((64, 64, 32), 4, 3), Config((128, 128, 32), 8, 3),
                  Config((128, 64, 32), 4, 4), Config((64, 128, 32), 4, 4),
                  Config((32, 32, 32), 4, 2))  # fmt: skip
LABELS = frozenset(c.label for c in (*ELEMENTWISE_CONFIGS, *REDUCTION_CONFIGS, *MATMUL_CONFIGS))
"""Every configuration a tuner's file may name (anything else there is ignored)."""


@dataclass
class RuntimeStats:
    """Kernels ``compiled`` (loaded into this process), found in memory, ``launches``."""

    compiled: int = 0
    memory_hits: int = 0
    launches: int = 0


class TritonRuntime:
    """Compiles blocks to Triton kernels, once per ``Block.key()``, and runs them.

    Args:
        cache: the fusion cache folder (its ``triton/`` subfolder holds this runtime's
            files); default ``cache_folder.cache_dir()``.

    Raises:
        BackendUnavailableError: triton is missing, or there is no CUDA GPU and Triton's
            interpreter is off (:func:`unavailable_reason`).
        UnsafeCacheError: another user could write the cache folder (``cache_folder``).
    """

    name = "triton"
    tensors = "torch"
    """The values it takes: torch tensors (the executor hands them over as they are)."""
    tune_min_elements = 1 << 12
    tune_max_elements = 1 << 31
    LABELS = LABELS

    def __init__(self, cache: str | os.PathLike | None = None) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise BackendUnavailableError(reason)
        self.cache = code_folder(Path(cache if cache is not None else cache_dir()) / "triton")
        self.interpret = interpreting()
        self.place = "cpu" if self.interpret else "cuda"
        self.tunes = not self.interpret
        self.stats = RuntimeStats()
        self._kernels: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        self._version = _generator_version()
        if not os.environ.get("TRITON_CACHE_DIR") and not self.interpret:
            # Compiled binaries beside our sources (one folder to clear), unless the user
            # put Triton's cache elsewhere.
            triton.knobs.cache.dir = str(code_folder(self.cache / "compiled", tree=True))

    # ------------------------------------------------------------------ tuning hooks
    def thread_count(self) -> int:
        """The tuner's thread limit: a launch is one "thread" (configs are the candidates)."""
        return 1

    def machine(self) -> str:
        """The machine kind choices are made for: the GPU's name and compute capability."""
        if self.interpret:
            return "triton-interpreter"
        import torch

        name = torch.cuda.get_device_name()
        major, minor = torch.cuda.get_device_capability()
        return re.sub(r"[^A-Za-z0-9_]", "_", f"cuda-{name}-sm{major}{minor}")

    def configs(self, block: ir.Block) -> tuple[Config, ...]:
        """The launch configurations worth timing for ``block`` (the first is the default)."""
        return REDUCTION_CONFIGS if block.axis is not None else ELEMENTWISE_CONFIGS

    def configs_of(self, kind: str) -> tuple[Config, ...]:
        """The launch configurations of a kernel kind: ``"matmul"``."""
        return MATMUL_CONFIGS

    def synchronize(self) -> None:
        """Waits for the kernels launched so far (the tuner times whole runs)."""
        if not self.interpret:
            import torch

            torch.cuda.synchronize()

    # ------------------------------------------------------------------ compiling
    def kernel(self, block: ir.Block, wide: bool = False):
        """The kernel of ``block`` (generated and loaded on first use of its key)."""
        from ember.backends.fusion.triton_source import generate

        return self._module(("block", block.key(), wide), lambda: generate(block, wide)).kernel

    def _module(self, key: tuple, source):
        """The loaded module of ``key``; ``source()`` makes its text on first use."""
        with self._lock:
            found = self._kernels.get(key)
            if found is not None:
                self.stats.memory_hits += 1
                return found
            text = source()
            digest = hashlib.sha256(f"{self._version}\n{key!r}".encode()).hexdigest()[:32]
            name = f"t_{digest}"
            path = code_folder(self.cache) / f"{name}.py"
            if not path.exists() or path.read_bytes() != text.encode():
                atomic_write(path, text.encode())
            check_module(path)
            spec = importlib.util.spec_from_file_location(f"ember_triton_kernels.{name}", path)
            module = importlib.util.module_from_spec(spec)
            with interpreter(self.interpret):
                spec.loader.exec_module(module)  # triton.jit reads TRITON_INTERPRET here
            sys.modules[spec.name] = module
            self._kernels[key] = module
            self.stats.compiled += 1
            return module

    # ------------------------------------------------------------------ running
    def run(self, block: ir.Block, inputs: list, out: list | None = None,
            config: str | Config | None = None) -> list:  # fmt: skip
        """Computes ``block`` on ``inputs`` (torch tensors of its inputs' shapes and dtypes);
        returns its outputs, written into ``out`` when given (None entries are allocated).
        ``config`` is a launch configuration or its label (default: the kind's first)."""
        import torch

        from ember.backends.fusion.numba_source import layout
        from ember.backends.fusion.triton_source import check

        check(block)
        arrays = []
        for tensor, spec in zip(inputs, block.inputs, strict=True):
            if tuple(tensor.shape) != spec.shape:
                raise ShapeError(f"triton runtime: input of shape {fmt_shape(tuple(tensor.shape))}"
                                 f", the block wants {fmt_shape(spec.shape)}")  # fmt: skip
            arrays.append(tensor.contiguous())
        device = arrays[0].device if arrays else self._device()
        outputs = []
        for o, r in enumerate(block.outputs):
            given = out[o] if out is not None else None
            if given is not None and given.is_contiguous():
                outputs.append(given)
            else:
                dtype = _torch_dtype(block.register_dtype(r))
                outputs.append(torch.empty(block.register_shape(r), dtype=dtype, device=device))
        lay = layout(block)
        sizes = [math.prod(block.shape[d] for d in dims) for dims in lay.groups]
        elements = math.prod(block.shape)
        chosen = self._config(block, config)
        if block.axis is None:
            total = elements
            width = _fit(chosen.block, total)
            grid = (triton.cdiv(total, width),)
        else:
            total = elements // block.shape[block.axis] if block.shape[block.axis] else 0
            width = _fit(chosen.block, block.shape[block.axis])
            grid = (total,)
        if total > 0:
            kernel = self.kernel(block, wide=elements >= WIDE)
            kernel[grid](*arrays, *outputs, *block.scalars(), *sizes, total,
                         BLOCK=width, num_warps=chosen.warps,
                         num_stages=chosen.stages)  # fmt: skip
            self.stats.launches += 1
        if out is not None:
            for o, (given, made) in enumerate(zip(out, outputs, strict=True)):
                if given is not None and given is not made:
                    given.copy_(made)
                    outputs[o] = given
        return outputs

    def run_matmul(self, block: ir.Block, value: int, a, b, others: list,
                   keep_value: bool = False, config: str | Config | None = None) -> list:  # fmt: skip
        """``a @ b`` (``[..., M, K]`` by ``[K, N]`` or ``[..., K, N]`` of the same batch) with
        ``block`` applied in the store: ``value`` is the block's input register holding the
        product, ``others`` the tensors of its other inputs in register order. Returns the
        block's outputs, and the product last when ``keep_value``."""
        import torch

        from ember.backends.fusion.triton_matmul import generate

        spec = block.inputs[value]
        if tuple(a.shape[:-2]) != spec.shape[:-2] and b.dim() != 2:
            raise KernelUnsupported("triton matmul: batch dims of a and b differ")
        m, k = a.shape[-2], a.shape[-1]
        n = b.shape[-1]
        out_shape = spec.shape
        z = math.prod(out_shape[:-2])
        a3 = a.reshape(z, m, k)
        b3 = b.reshape(1 if b.dim() == 2 else z, k, n)
        strides = []
        tensors = []
        for i, tensor in zip([i for i in range(len(block.inputs)) if i != value], others,
                             strict=True):  # fmt: skip
            view = tensor.reshape(block.inputs[i].shape).expand(out_shape).reshape(z, m, n)
            tensors.append(view)
            strides.extend(view.stride())
        key = ("matmul", block.key(), value, keep_value)
        kernel = self._module(key, lambda: generate(block, value, keep_value)).kernel
        outputs = [torch.empty(out_shape, dtype=_torch_dtype(block.register_dtype(r)),
                               device=a.device) for r in block.outputs]  # fmt: skip
        if keep_value:
            outputs.append(torch.empty(out_shape, dtype=_torch_dtype(spec.dtype), device=a.device))
        if z > MAX_BATCH:
            raise KernelUnsupported(f"triton matmul: a batch of {z} (grid's second dim)")
        chosen = self._config(None, config)
        bm, bn, bk = chosen.block
        if z * m * n > 0:
            grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), z)
            sb = b3.stride()
            kernel[grid](a3, b3, *tensors, *outputs, *block.scalars(), m, n, k, *a3.stride(),
                         0 if b.dim() == 2 else sb[0], sb[1], sb[2], *strides,
                         BM=bm, BN=bn, BK=bk, num_warps=chosen.warps,
                         num_stages=chosen.stages)  # fmt: skip
            self.stats.launches += 1
        return outputs

    def _config(self, block: ir.Block | None, config: str | Config | None) -> Config:
        candidates = self.configs(block) if block is not None else MATMUL_CONFIGS
        if config is None:
            return candidates[0]
        if isinstance(config, Config):
            return config
        for c in candidates:
            if c.label == config:
                return c
        return candidates[0]  # a label of another kind (a stale file): the default

    def _device(self):
        import torch

        return torch.device(self.place)


MAX_BATCH = 65535
"""The most matmul problems of one launch (CUDA's limit on a grid's second dim)."""


def _fit(block: int, length: int) -> int:
    """A configuration's ``BLOCK`` cut to the power of two that covers ``length`` (at least
    16): a row of 37 is not walked in programs of 1024 lanes. One compiled variant per
    power of two, as ``BLOCK`` is a compile-time constant."""
    return min(block, max(16, 1 << max(0, length - 1).bit_length()))


@contextlib.contextmanager
def interpreter(on: bool = True) -> Iterator[None]:
    """``TRITON_INTERPRET`` set to ``on`` for the block, then as it was: kernels are
    decorated for the interpreter or not as the runtime was made, whatever the variable
    says later (a runtime made inside the block keeps the interpreter)."""
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if on else "0"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


def _torch_dtype(d):
    from ember.backends.torch.backend import _TO_TORCH

    return _TO_TORCH[d]


def supported_dtype(d) -> bool:
    """Whether kernels take tensors of dtype ``d``."""
    return d in TL_DTYPES
