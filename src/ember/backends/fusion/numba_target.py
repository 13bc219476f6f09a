"""The machine code numba emits for ember's kernels: full-width vectors on AVX-512 hosts.

LLVM tunes its models of Intel's AVX-512 cores (Ice Lake, Rocket Lake, Sapphire Rapids and
later) to prefer 256-bit vectors, so a loop numba compiles there uses ``ymm`` registers
although the CPU has ``zmm`` ones twice as wide. ember's kernels are compute bound where
it matters (erf, exp and tanh approximations, register-tiled products), so on such a host
the same source runs up to twice as fast with the preference off. Measured on a
Sapphire Rapids-class vCPU, one thread: the fused GELU kernel over 16M float32 20.1 ->
13.0 ms, softmax over ``[4096, 1024]`` 2.33 -> 1.89.

:func:`widen_vectors` turns the preference off by giving numba the host's own features
plus ``-prefer-256-bit``. numba reads its target features once, when its code generator
is made (at the first function it compiles or decorates), so this module calls it on
import, which ``ember.backends.fusion`` does first, before any of ember's kernels exist.
``EMBER_FUSION_VECTOR_BITS=256`` asks for 256-bit vectors instead: the features then end
in ``+prefer-256-bit``, since LLVM's model of AMD's Zen 4 has no such preference and used
``zmm`` registers where the setting promised ``ymm`` ones. It changes nothing where:

* the host has no AVX-512;
* the user chose numba's target (``NUMBA_CPU_NAME`` or ``NUMBA_CPU_FEATURES``);
* numba's code generator exists already (its target is fixed by then).

The setting is numba's, so it holds for any numba code the process compiles later.

numba keys its disk cache by the target features, so kernels compiled either way never
meet the other's machine code.
"""

from __future__ import annotations

import functools
import os

from ember.backend.errors import ConfigError

__all__ = ["CACHE_LINE_BYTES", "host_features", "requested_bits", "target_name", "vector_bytes",
           "widen_vectors"]  # fmt: skip

CACHE_LINE_BYTES = 64
"""Bytes of a cache line: what one prefetch asks for (the GEMM tile's, the element-wise
kernels')."""

_WIDE = "-prefer-256-bit"
_NARROW = "+prefer-256-bit"
_widened = False


@functools.cache
def host_features() -> dict[str, bool]:
    """The host CPU's features as LLVM reports them (``{"avx512f": True, ...}``); empty
    without llvmlite (numba is an optional extra) or on a host LLVM cannot query."""
    try:
        from llvmlite import binding

        return dict(binding.get_host_cpu_features())
    except Exception:
        return {}


def requested_bits() -> int | None:
    """``EMBER_FUSION_VECTOR_BITS``: 256 (256-bit vectors) or 512 (the default where the
    host has AVX-512); None when unset or blank.

    Raises:
        ConfigError: any other value, naming the variable and the value.
    """
    text = os.environ.get("EMBER_FUSION_VECTOR_BITS")
    if text is None or not text.strip():
        return None
    if text.strip() not in ("256", "512"):
        raise ConfigError(f"EMBER_FUSION_VECTOR_BITS={text!r}: expected 256 (256-bit "
                          "vectors) or 512 (the widest on an AVX-512 host; the default)")  # fmt: skip
    return int(text)


def widen_vectors() -> bool:
    """Lets LLVM use 512-bit vectors in numba's code where the host has AVX-512, or keeps it
    at 256 bits where ``EMBER_FUSION_VECTOR_BITS=256`` (see the module doc); returns whether
    numba's target now says 512. numba's code generator is made here too, so its target is
    fixed: a later reload of numba's config (any ``NUMBA_`` variable set afterwards) would
    otherwise reset the features before the first compile."""
    global _widened
    if _widened:
        return True
    try:
        import numba.core.config as config
        from llvmlite import binding
        from numba.core.registry import cpu_target
    except ImportError:  # numba is an optional extra
        return False
    if any(os.environ.get(name) for name in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")):
        return False
    if "_toplevel_target_context" in vars(cpu_target):  # numba's codegen exists already
        return False
    if not host_features().get("avx512f", False):
        return False
    wide = requested_bits() != 256
    preference = _WIDE if wide else _NARROW
    config.CPU_FEATURES = f"{binding.get_host_cpu_features().flatten()},{preference}"
    cpu_target.target_context  # noqa: B018 - makes the codegen, which reads the features (~2 ms)
    _widened = wide
    return wide


def vector_bytes() -> int:
    """Bytes of the vectors ember's register-tiled kernels (products, convolutions) size
    their tiles for: 64 where the host has AVX-512, unless ``EMBER_FUSION_VECTOR_BITS=256``
    keeps LLVM at 256 bits, else 32. A tile sized for 512-bit registers that LLVM splits
    in two needs twice the registers and spills."""
    if requested_bits() == 256:
        return 32
    return 64 if host_features().get("avx512f", False) else 32


def target_name() -> str:
    """The CPU model numba compiles for, as LLVM names it, with ``-wide`` where
    :func:`widen_vectors` took effect (``sapphirerapids-wide``, ``znver3``); ``generic``
    without numba. Kernels run at other speeds on another model or width, so the tuner's
    choices (``autotune.machine``) are kept apart by it."""
    try:
        import numba.core.config as config
        from llvmlite import binding
    except ImportError:
        return "generic"
    return (config.CPU_NAME or binding.get_host_cpu_name()) + ("-wide" if _widened else "")


widen_vectors()
