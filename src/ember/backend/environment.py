"""Settings read from environment variables, checked the same way everywhere."""

from __future__ import annotations

import os

from ember.backend.errors import ConfigError

__all__ = ["whole_number"]


def whole_number(name: str, default: int, unit: str, zero: str) -> int:
    """The environment variable ``name`` as a whole number of ``unit`` of at least 0;
    ``default`` when it is unset or blank. ``zero`` says what 0 does (for the message).

    Raises:
        ConfigError: the variable holds anything else, naming it and its value.

    Example:
        >>> whole_number("EMBER_EXAMPLE_UNSET", 7, "items", "0 turns it off")
        7
    """
    text = os.environ.get(name)
    if text is None or text.strip() == "":
        return default
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(f"{name}={text!r}: expected a whole number of {unit} of at least 0 "
                          f"({zero})")  # fmt: skip
    return value
