"""Compiles the Triton runtime's kernels for a GPU target on a machine without a GPU.

Triton's interpreter (what the CPU tests run) executes a kernel's Python directly, so it
accepts code the GPU compiler refuses (a global that is not a ``tl.constexpr`` object, an
operand type the compiler does not lower). :class:`CompileCheck` wraps a
``TritonRuntime``: every kernel it launches through the interpreter is also compiled, for
the same arguments' types, to a cubin for ``TARGET`` (Triton's own LLVM and ``ptxas``; no
driver needed), once per signature. A compile error fails the launch with Triton's message.

``test_triton_runtime.py`` checks its kernels so. As a pytest plugin the module checks a
whole run's, e.g. the conformance suite on the interpreter kind::

    PYTHONPATH=tests/backends/fusion EMBER_TEST_BACKENDS=fusion-triton \
        .venv/bin/python -m pytest -p triton_compile_check tests/backend
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

TARGET = ("cuda", 90, 32)
"""Hopper (H100/H200), as the GPU checks run on (``scripts/gpu_checks.sh``)."""

_POINTER = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64",
            "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8",
            "bool": "i1"}  # fmt: skip


def _arg_type(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return "*" + _POINTER[str(value.dtype).removeprefix("torch.")]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for a kernel argument of type {type(value).__name__}")


_PROBE = """\
import triton
import triton.language as tl


@triton.jit
def kernel(in0, out0, total, BLOCK: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out0 + idx, tl.load(in0 + idx, mask=idx < total, other=0), mask=idx < total)
"""


def unavailable_reason(folder) -> str | None:
    """Why this Triton cannot compile for ``TARGET`` here (a small kernel tried, its file
    written into ``folder``), or None when it can: an older Triton's compile API, or a
    wheel without its GPU toolchain."""
    import torch

    path = folder / "compile_probe.py"
    path.write_text(_PROBE)
    module = type("Module", (), {"__file__": str(path), "__name__": "compile_probe"})
    try:
        CompileCheck().compile(module, (torch.zeros(4), torch.zeros(4), 4), {"BLOCK": 4})
    except Exception as error:  # any failure: the check cannot run, the tests say why
        return f"Triton cannot compile for {TARGET} here: {type(error).__name__}: {error}"
    return None


class CompileCheck:
    """Compiles each kernel a runtime launches for ``TARGET`` too (see the module doc)."""

    def __init__(self) -> None:
        self.compiled: set[tuple] = set()
        self._jit: dict[str, Any] = {}

    def jit_kernel(self, module) -> Any:
        """The module's ``kernel`` as a compilable ``JITFunction`` (the runtime loaded it under
        the interpreter: loaded again from its file with the interpreter off)."""
        path = module.__file__
        found = self._jit.get(path)
        if found is None:
            from ember.backends.fusion.triton_runtime import interpreter

            name = "ember_triton_compile_check." + module.__name__.rsplit(".", 1)[-1]
            spec = importlib.util.spec_from_file_location(name, path)
            copy = importlib.util.module_from_spec(spec)
            with interpreter(False):
                spec.loader.exec_module(copy)
            sys.modules[name] = copy  # triton reads the kernel's globals through its module
            found = self._jit[path] = copy.kernel
        return found

    def compile(self, module, args: tuple, constants: dict[str, Any]) -> None:
        """Compiles ``module.kernel`` for the types of ``args`` and the ``constants``."""
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        jit = self.jit_kernel(module)
        options = {k: constants.pop(k) for k in ("num_warps", "num_stages") if k in constants}
        signature, given = {}, iter(args)
        for param in jit.params:
            if param.is_constexpr:
                signature[param.name] = "constexpr"
                continue
            value = next(given)
            signature[param.name] = param.annotation_type.removeprefix("tl.") or _arg_type(value)
        key = (module.__file__, tuple(signature.items()), tuple(sorted(constants.items())),
               tuple(sorted(options.items())))  # fmt: skip
        if key in self.compiled:
            return
        source = ASTSource(fn=jit, signature=signature, constexprs=constants)
        triton.compile(source, target=GPUTarget(*TARGET), options=options)
        self.compiled.add(key)

    def install(self, monkeypatch: Any, runtime_class: type) -> None:
        """Wraps ``runtime_class._module`` so every launched kernel is compiled first."""
        check = self
        load = runtime_class._module

        def _module(runtime, key, source):
            module = load(runtime, key, source)
            return _Checked(module, check)

        monkeypatch.setattr(runtime_class, "_module", _module)


class _Checked:
    """A loaded kernel module whose ``kernel[grid](...)`` compiles for the GPU, then runs."""

    def __init__(self, module, check: CompileCheck) -> None:
        self._module, self._check = module, check

    @property
    def kernel(self):
        return _Launcher(self._module, self._check)


class _Launcher:
    def __init__(self, module, check: CompileCheck) -> None:
        self._module, self._check = module, check

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self._check.compile(self._module, args, dict(kwargs))
            return self._module.kernel[grid](*args, **kwargs)

        return launch



def pytest_configure(config) -> None:
    """As a plugin (``-p triton_compile_check``): checks every kernel of the run."""
    import pytest

    from ember.backends.fusion import triton_runtime

    CompileCheck().install(pytest.MonkeyPatch(), triton_runtime.TritonRuntime)  # never undone
