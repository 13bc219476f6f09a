"""numba's target for ember's kernels: 512-bit vectors where the host has AVX-512.

Each case runs in a fresh interpreter, since numba fixes its target once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

numba = pytest.importorskip("numba", reason="numba is not installed (pip install 'ember[jit]')")
from llvmlite import binding  # noqa: E402  (numba's own dependency)

AVX512 = bool(binding.get_host_cpu_features().get("avx512f", False))

# A loop that LLVM vectorizes: on an AVX-512 host its machine code shows which registers
# the vectorizer chose (zmm: 512 bits, ymm: 256).
_CHILD = """
import json
import numpy as np
import ember.backends.fusion
from ember.backends.fusion.numba_math import fast_erf_f32
from ember.backends.fusion.numba_target import widen_vectors
from ember.backends.fusion.numba_tile import VECTOR_BYTES
import numba
import numba.core.config as config

@numba.njit(fastmath={"contract"}, error_model="numpy")
def erf_all(x, out):
    for i in range(x.shape[0]):
        out[i] = fast_erf_f32(x[i])

x = np.linspace(-5, 5, 4099, dtype=np.float32)
out = np.empty_like(x)
erf_all(x, out)
asm = erf_all.inspect_asm(erf_all.signatures[0])
print(json.dumps({"tile_bytes": VECTOR_BYTES, "zmm": asm.count("zmm"), "ymm": asm.count("ymm"),
                  "again": widen_vectors(), "features": config.CPU_FEATURES, "max_err": float(np.abs(out - np.vectorize(
                      __import__("math").erf)(x.astype(np.float64))).max())}))
"""


def _child(**env: str) -> dict:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "EMBER_FUSION_VECTOR_BITS")}  # fmt: skip
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", _CHILD], env=environ, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kernels_use_the_widest_vectors_the_host_has():
    got = _child()
    assert got["max_err"] < 2e-7  # the widened code computes the same erf
    if not AVX512:
        assert got["features"] is None and got["zmm"] == 0 and not got["again"]
        assert got["tile_bytes"] == 32
        pytest.skip("this host has no AVX-512: only checked that nothing changed")
    assert got["features"].endswith(",-prefer-256-bit")
    assert got["again"] is True
    assert got["zmm"] > 0 and got["zmm"] > got["ymm"], got
    assert got["tile_bytes"] == 64  # register tiles sized for 512-bit vectors


@pytest.mark.skipif(not AVX512, reason="this host has no AVX-512: no vector width to choose")
@pytest.mark.parametrize("env", [{"EMBER_FUSION_VECTOR_BITS": "256"},
                                 {"NUMBA_CPU_FEATURES": "+avx2,+fma,+avx512f,+avx512vl"}])  # fmt: skip
def test_the_users_choice_of_target_wins(env):
    got = _child(**env)
    assert got["again"] is False
    if "EMBER_FUSION_VECTOR_BITS" in env:
        # 256 bits on every AVX-512 model, also where LLVM would go wider (its Zen 4 model)
        assert got["features"].endswith(",+prefer-256-bit"), got
        assert got["zmm"] == 0 and got["ymm"] > 0, got
        assert got["tile_bytes"] == 32  # tiles sized for the registers LLVM will use
    else:
        assert got["features"] == env["NUMBA_CPU_FEATURES"]
    assert got["max_err"] < 2e-7


def test_a_target_numba_fixed_earlier_is_left_alone():
    code = ("import numba\n"
            "numba.njit(lambda x: x)(1)\n"  # numba's codegen exists before ember's import
            "import numba.core.config as config\n"
            "from ember.backends.fusion.numba_target import widen_vectors\n"
            "print(widen_vectors(), config.CPU_FEATURES)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={k: v for k, v in os.environ.items()
                                            if not k.startswith("NUMBA_CPU")})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "None"]


def test_tuning_choices_are_kept_per_cpu_model_and_vector_width():
    from ember.backends.fusion import autotune
    from ember.backends.fusion.numba_target import target_name

    name = target_name()
    assert name == binding.get_host_cpu_name() + ("-wide" if AVX512 else "")
    assert autotune.machine().endswith(f"cpu-{name}")


@pytest.mark.skipif(not AVX512, reason="this host has no AVX-512: no vector width to choose")
def test_a_later_reload_of_numbas_config_keeps_the_wide_target():
    """numba rereads its config when a NUMBA_ variable changes, which resets the features;
    the target is fixed on ember's import, so kernels compiled after that stay wide."""
    code = _CHILD.replace("import numba\nimport numba.core.config as config\n", (
        "import numba\nimport numba.core.config as config\nimport os\n"
        "os.environ['NUMBA_OPT'] = '3'\nconfig.reload_config()\n"))  # fmt: skip
    assert "reload_config" in code
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={k: v for k, v in os.environ.items()
                                            if not k.startswith("NUMBA_CPU")})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["features"] is None  # numba's config was reset ...
    assert got["zmm"] > got["ymm"] and got["again"] is True  # ... its codegen was not


@pytest.mark.parametrize("value", ["128", "1024", "wide", "256 bits"])
def test_a_bad_vector_width_is_a_config_error_naming_it(monkeypatch, value):
    from ember.backend.errors import ConfigError
    from ember.backends.fusion import numba_target

    monkeypatch.setenv("EMBER_FUSION_VECTOR_BITS", value)
    with pytest.raises(ConfigError, match=rf"EMBER_FUSION_VECTOR_BITS='{value}': expected 256"):
        numba_target.requested_bits()
    with pytest.raises(ConfigError):
        numba_target.vector_bytes()
    for good, bits in (("256", 256), (" 512 ", 512), ("", None)):
        monkeypatch.setenv("EMBER_FUSION_VECTOR_BITS", good)
        assert numba_target.requested_bits() == bits


def test_a_bad_vector_width_stops_the_fusion_import_with_the_error():
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    env["EMBER_FUSION_VECTOR_BITS"] = "128"
    done = subprocess.run([sys.executable, "-c", "import ember\nember.device('ndarray').fusion()"],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert done.returncode != 0
    assert "ConfigError: EMBER_FUSION_VECTOR_BITS='128': expected 256" in done.stderr

