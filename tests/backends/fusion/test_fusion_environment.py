"""Every EMBER_FUSION_* setting a user can mistype: a ConfigError naming the variable and
its value where fusion reads it (making a device, a pool, a runtime, replaying), never a
bare ValueError from deep inside and never a silent default."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import ember
from ember import Tensor
from ember.backend.errors import ConfigError
from ember.backends.fusion import autotune, plans, replay
from ember.backends.fusion.buffers import BufferPool


def _make_device():
    return ember.device("ndarray").fusion()


def _replay():
    device = ember.device("ndarray").fusion()
    return replay(lambda t: t * 2.0)(Tensor.from_data(np.ones(3, np.float32), device))


def _spin():
    from ember.backends.fusion.numba_spin import spin_seconds

    return spin_seconds()


def _numba_runtime():
    pytest.importorskip("numba")
    from ember.backends.fusion.numba_runtime import NumbaRuntime

    return NumbaRuntime()


def _parts():
    pytest.importorskip("numba")
    from ember.backends.fusion.numba_runtime import parts_for

    return parts_for(1 << 20, 1, None)


READERS = {  # variable: what reads it
    "EMBER_FUSION": _make_device,
    "EMBER_FUSION_DEBUG": _make_device,
    "EMBER_FUSION_AUTOTUNE": autotune.enabled,
    "EMBER_FUSION_PLANS": plans.enabled,
    "EMBER_FUSION_REPLAY": _replay,
    "EMBER_FUSION_HUGE_PAGES": BufferPool,
    "EMBER_FUSION_POOL_BYTES": BufferPool,
    "EMBER_FUSION_SPIN_US": _spin,
    "EMBER_FUSION_THREADS": _numba_runtime,
}


@pytest.mark.parametrize("variable", sorted(READERS))
@pytest.mark.parametrize("text", ["abc", "-2"])
def test_a_mistyped_setting_names_itself(monkeypatch, variable, text):
    monkeypatch.setenv(variable, text)
    with pytest.raises(ConfigError, match=rf"^{variable}={text!r}: expected "):
        READERS[variable]()


@pytest.mark.parametrize("text", ["0", "1.5"])
def test_thread_counts_start_at_one(monkeypatch, text):
    monkeypatch.setenv("EMBER_FUSION_THREADS", text)
    with pytest.raises(ConfigError, match="a whole number of threads of at least 1"):
        _parts()


def test_settings_as_written_still_take_effect(monkeypatch):
    monkeypatch.setenv("EMBER_FUSION_POOL_BYTES", "0")
    monkeypatch.setenv("EMBER_FUSION_HUGE_PAGES", "off")
    pool = BufferPool()
    assert pool.max_idle_bytes == 0 and pool.huge_pages is False
    monkeypatch.setenv("EMBER_FUSION_AUTOTUNE", "no")
    assert autotune.enabled() is False
    monkeypatch.setenv("EMBER_FUSION_THREADS", "3")
    assert _parts() == 3
    monkeypatch.setenv("EMBER_FUSION", "false")
    assert _make_device().backend.lazy is False  # every op runs at once
    monkeypatch.setenv("EMBER_FUSION", "1")
    assert _make_device().backend.lazy is True


def test_a_new_process_refuses_a_bad_thread_count_when_the_device_is_made():
    pytest.importorskip("numba")
    code = "import ember\nember.device('ndarray').fusion()\nprint('made')"
    env = {**os.environ, "EMBER_FUSION_THREADS": "two"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 1 and "made" not in out.stdout
    assert "ConfigError: EMBER_FUSION_THREADS='two': expected a whole number of threads" in out.stderr
