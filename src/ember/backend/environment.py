"""Settings read from environment variables, checked the same way everywhere."""

from __future__ import annotations

import os

from ember.backend.errors import ConfigError

__all__ = ["count", "switch", "whole_number"]


_SWITCHES = {"1": True, "true": True, "yes": True, "on": True,
             "0": False, "false": False, "no": False, "off": False}  # fmt: skip


def switch(name: str, default: bool) -> bool:
    """The environment variable ``name`` as on or off: ``1`` or ``0`` (also ``true`` /
    ``false``, ``yes`` / ``no``, ``on`` / ``off``, in any case); ``default`` when it is
    unset or blank.

    Raises:
        ConfigError: the variable holds anything else, naming it and its value.

    Example:
        >>> switch("EMBER_EXAMPLE_UNSET", True)
        True
    """
    text = os.environ.get(name)
    if text is None:
        return default
    value = _SWITCHES.get(text.strip().lower())
    if value is None:
        if not text.strip():
            return default
        raise ConfigError(f"{name}={text!r}: expected 1 (on) or 0 (off), or true/false, "
                          f"yes/no, on/off; unset means {int(default)}")  # fmt: skip
    return value


def count(name: str, unit: str) -> int | None:
    """The environment variable ``name`` as a whole number of ``unit`` of at least 1; None
    when it is unset or blank (the caller's default applies).

    Raises:
        ConfigError: the variable holds anything else, naming it and its value.

    Example:
        >>> count("EMBER_EXAMPLE_UNSET", "threads") is None
        True
    """
    return _whole(name, 1, f"a whole number of {unit} of at least 1, or nothing for the default")


def whole_number(name: str, default: int, unit: str, zero: str) -> int:
    """The environment variable ``name`` as a whole number of ``unit`` of at least 0;
    ``default`` when it is unset or blank. ``zero`` says what 0 does (for the message).

    Raises:
        ConfigError: the variable holds anything else, naming it and its value.

    Example:
        >>> whole_number("EMBER_EXAMPLE_UNSET", 7, "items", "0 turns it off")
        7
    """
    value = _whole(name, 0, f"a whole number of {unit} of at least 0 ({zero})")
    return default if value is None else value


def _whole(name: str, minimum: int, expected: str) -> int | None:
    """``name`` as an int of at least ``minimum``; None when unset or blank."""
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        return None
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ConfigError(f"{name}={text!r}: expected {expected}")
    return value
