"""Configs: typed, frozen, validated settings that save to and load from JSON.

* :class:`Config` (``ember.config.base``): the base class of every config.
* :class:`Variant` (``ember.config.variant``): config families, ember's enums with fields
  (an initializer, a padding, a gradient-clipping rule, ...).
* ``ember.config.fields``: constrained field types the configs share (sizes, rates,
  probabilities, tuples written as JSON lists).
"""

from ember.backend.errors import ConfigError, ConfigFileNotFoundError
from ember.config.base import Config
from ember.config.variant import Variant

__all__ = ["Config", "ConfigError", "ConfigFileNotFoundError", "Variant"]
