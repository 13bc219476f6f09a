"""Settings from environment variables: each spelling a user may type gives the exact
value, anything else a ConfigError that names the variable and what it holds."""

from __future__ import annotations

import pytest

from ember.backend.environment import count, switch, whole_number
from ember.backend.errors import ConfigError

NAME = "EMBER_TEST_SETTING"


@pytest.mark.parametrize("default", [True, False])
@pytest.mark.parametrize("text", [None, "", "   "])
def test_a_switch_left_unset_or_blank_keeps_its_default(monkeypatch, default, text):
    monkeypatch.delenv(NAME, raising=False)
    if text is not None:
        monkeypatch.setenv(NAME, text)
    assert switch(NAME, default) is default


@pytest.mark.parametrize("text, value", [("1", True), ("TRUE", True), (" yes ", True),
                                         ("On", True), ("0", False), ("false", False),
                                         ("NO", False), ("off ", False)])  # fmt: skip
def test_a_switch_reads_each_spelling(monkeypatch, text, value):
    monkeypatch.setenv(NAME, text)
    assert switch(NAME, not value) is value


@pytest.mark.parametrize("text", ["x", "2", "enable", "-1", "0.0"])
def test_a_switch_refuses_anything_else(monkeypatch, text):
    monkeypatch.setenv(NAME, text)
    with pytest.raises(ConfigError) as caught:
        switch(NAME, True)
    assert str(caught.value) == (f"{NAME}={text!r}: expected 1 (on) or 0 (off), or "
                                 "true/false, yes/no, on/off; unset means 1")  # fmt: skip


@pytest.mark.parametrize("text, value", [(None, None), ("", None), (" ", None), ("1", 1),
                                         ("16", 16), (" 8 ", 8)])  # fmt: skip
def test_a_count_reads_whole_numbers_from_one(monkeypatch, text, value):
    monkeypatch.delenv(NAME, raising=False)
    if text is not None:
        monkeypatch.setenv(NAME, text)
    assert count(NAME, "threads") == value


@pytest.mark.parametrize("text", ["0", "-3", "abc", "2.5", "1e3"])
def test_a_count_refuses_anything_else(monkeypatch, text):
    monkeypatch.setenv(NAME, text)
    with pytest.raises(ConfigError) as caught:
        count(NAME, "threads")
    assert str(caught.value) == (f"{NAME}={text!r}: expected a whole number of threads of "
                                 "at least 1, or nothing for the default")  # fmt: skip


@pytest.mark.parametrize("text, value", [(None, 7), ("0", 0), ("12", 12)])
def test_a_whole_number_reads_from_zero(monkeypatch, text, value):
    monkeypatch.delenv(NAME, raising=False)
    if text is not None:
        monkeypatch.setenv(NAME, text)
    assert whole_number(NAME, 7, "items", "0 turns it off") == value


@pytest.mark.parametrize("text", ["-1", "many"])
def test_a_whole_number_refuses_anything_else(monkeypatch, text):
    monkeypatch.setenv(NAME, text)
    with pytest.raises(ConfigError, match=rf"^{NAME}={text!r}: expected a whole number of "
                                          r"items of at least 0 \(0 turns it off\)$"):  # fmt: skip
        whole_number(NAME, 7, "items", "0 turns it off")


def _print_a_tensor():
    import ember

    return str(ember.Tensor.from_data([1.0, 2.0], ember.device("ndarray")))


def _distributed_pool():
    from ember.distributed.buffers import BufferPool

    return BufferPool()


def _distributed_check():
    from ember.distributed.collectives import _checking

    return _checking(None)


@pytest.mark.parametrize("variable, reader", [("EMBER_PRINT_THRESHOLD", _print_a_tensor),
                                              ("EMBER_DIST_POOL_BYTES", _distributed_pool),
                                              ("EMBER_DIST_CHECK", _distributed_check)])  # fmt: skip
def test_readers_outside_fusion_name_a_mistyped_setting(monkeypatch, variable, reader):
    monkeypatch.setenv(variable, "lots")
    with pytest.raises(ConfigError, match=rf"^{variable}='lots': expected "):
        reader()
