"""Config families: one config class per variant, saved with the variant's name.

Burn configures some choices with enums (an initializer is ``Zeros``, or
``KaimingUniform { gain, fan_out_only }``, ...). ember writes such a family as
a root class that derives from :class:`Variant` and one :class:`~ember.Config`
subclass of the root per variant, so each variant carries its own fields,
defaults, ``with_<field>`` builders and behaviour.

A config field annotated with the root accepts any variant, and in JSON a
variant is written under its name, as serde writes Rust enums:
``{"KaimingUniform": {"gain": 0.57, "fan_out_only": false}}``, or just
``"Zeros"`` for a variant without fields. The variants a field accepts are those
defined when the class holding the field is created, so a family is closed, like
an enum. Every variant is also reachable from its root (``Initializer.Zeros``).

Unwrapping the name hands a variant's fields to validation as Python values, in
the configs' strict mode, even when they come from JSON: a tuple field of a
variant must accept a list itself (``ember.config.fields`` has such field types).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import GetCoreSchemaHandler, model_serializer, model_validator
from pydantic_core import CoreSchema, core_schema

from ember.backend.errors import ConfigError
from ember.config import Config


class Variant(Config):
    """Base of config families; a direct subclass is a family root, its subclasses variants."""

    _variants: ClassVar[dict[str, type[Variant]]] = {}

    @classmethod
    def _root(cls) -> type[Variant] | None:
        """The family root: the class that derives from Variant directly (None for Variant)."""
        base = globals().get("Variant")  # unbound while pydantic builds Variant itself
        return next((klass for klass in cls.__mro__ if base in klass.__bases__), None)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        root = cls._root()
        if root is None:
            return
        if root is cls:
            cls._variants = {}
        elif not cls.__name__.startswith("_"):  # private classes share code between variants
            root._variants[cls.__name__] = cls
            setattr(root, cls.__name__, cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if type(self) is self._root():
            names = ", ".join(self._variants) or "none defined yet"
            raise ConfigError(f"{type(self).__name__} is a family of configs; build one of: {names}")
        super().__init__(*args, **kwargs)

    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        if cls is not cls._root() or not cls._variants:
            return handler(source)
        names = list(cls._variants)
        return core_schema.tagged_union_schema(
            {name: handler.generate_schema(variant) for name, variant in cls._variants.items()},
            discriminator=_tag,
            custom_error_type="variant",
            custom_error_message=(
                f"expected one of the {cls.__name__} variants {', '.join(names)} "
                '(in JSON {"Name": {fields}} or "Name")'
            ),
        )

    @model_validator(mode="wrap")
    @classmethod
    def _untag(cls, data: Any, handler: Any) -> Any:
        """Accepts the tagged JSON forms ``{"Name": {...}}`` and ``"Name"`` of this variant."""
        name = cls.__name__
        if isinstance(data, dict) and len(data) == 1 and name in data:
            data = data[name] if data[name] is not None else {}
        elif isinstance(data, str) and data == name:
            data = {}
        return handler(data)

    @model_serializer(mode="wrap")
    def _tagged(self, handler: Any) -> Any:
        fields = handler(self)
        return {type(self).__name__: fields} if fields else type(self).__name__


def _tag(value: Any) -> str | None:
    """The variant name of a config instance or of its tagged JSON form; None if it has none."""
    if isinstance(value, Variant):
        return type(value).__name__
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        key = next(iter(value))
        return key if isinstance(key, str) else None
    return None
