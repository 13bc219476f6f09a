"""Host memory (``ember.backend.host_memory``): once a backend is made, buffers NumPy frees
are reused by the next allocation instead of being faulted in again from fresh pages."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

from ember.backend import host_memory
from ember.backend.errors import ConfigError

ROUNDS, ARRAYS, ELEMENTS = 10, 3, 3 << 18  # 3 MiB float32 arrays
PAGES = ROUNDS * ARRAYS * ELEMENTS * 4 // 4096

_PROBE = textwrap.dedent(f"""
    import resource
    import numpy as np
    import ember

    ember.device("ndarray")

    def round_():  # a forward's temporaries: allocated, used, freed
        arrays = [np.ones({ELEMENTS}, np.float32) for _ in range({ARRAYS})]
        del arrays

    for _ in range(3):
        round_()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range({ROUNDS}):
        round_()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def _glibc() -> bool:
    try:
        return hasattr(ctypes.CDLL(None), "gnu_get_libc_version")
    except OSError:
        return False


def _page_faults(keep: str | None) -> int:
    env = {"EMBER_HOST_KEEP_MIB": keep} if keep is not None else {}
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                         check=True, env={**os.environ, **env}, timeout=120)  # fmt: skip
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not _glibc(), reason="malloc settings are glibc's; elsewhere nothing changes")
def test_freed_buffers_are_reused_without_page_faults():
    assert _page_faults(None) < PAGES // 100
    assert _page_faults("0") > PAGES // 2  # malloc left as it is: every page faults again


@pytest.mark.parametrize("text", ["abc", "-1", "1.5"])
def test_a_bad_setting_is_a_config_error_naming_it(monkeypatch, text):
    monkeypatch.setenv("EMBER_HOST_KEEP_MIB", text)
    with pytest.raises(ConfigError, match="EMBER_HOST_KEEP_MIB"):
        host_memory.keep_mib()


@pytest.mark.parametrize("text, mib", [("", host_memory.KEEP_MIB_DEFAULT), (" 64 ", 64), ("0", 0)])
def test_settings(monkeypatch, text, mib):
    monkeypatch.setenv("EMBER_HOST_KEEP_MIB", text)
    assert host_memory.keep_mib() == mib


def test_zero_leaves_malloc_alone():
    assert host_memory._apply(0) is False
