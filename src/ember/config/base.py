"""Configs: typed, frozen, validated settings that save to and load from JSON.

A config declares its fields as class annotations with optional defaults, the way
a dataclass does. Instances are immutable; ``with_<field>(value)`` returns a new,
validated copy with one field changed. Configs nest (a field whose type is another
config), compare by value, and round-trip through plain JSON with :meth:`Config.save`
and :meth:`Config.load`. Building a module from a config is the job of an ``init``
method that each user config defines; the base class has none.

Validation is done by pydantic in strict mode: Python values must already have the
declared type (an ``int`` is accepted where a ``float`` is declared, nothing else
is converted). Loading from JSON (``load``, ``load_json``, ``from_dict``) applies
JSON's rules on top of that: a JSON array fills a tuple field and an enum field
takes the enum's value. Every failure is an :class:`ember.ConfigError` whose
message names the field path and, for files, the file.

Example:
    >>> from ember import Config
    >>> class ModelConfig(Config):
    ...     num_classes: int
    ...     hidden_size: int
    ...     dropout: float = 0.5
    >>> config = ModelConfig(10, hidden_size=512)
    >>> config
    ModelConfig(num_classes=10, hidden_size=512, dropout=0.5)
    >>> config.with_dropout(0.2).dropout
    0.2
    >>> ModelConfig.from_dict(config.to_dict()) == config
    True
"""

import os
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pydantic
import pydantic_core
from pydantic import BaseModel, ConfigDict

from ember.atomic import atomic_write
from ember.backend.errors import ConfigError, ConfigFileNotFoundError

__all__ = ["Config", "ConfigError", "ConfigFileNotFoundError"]

C = TypeVar("C", bound="Config")

PathLike = str | os.PathLike

# pydantic error types whose message reads better as "expected ..., got <value>".
_EXPECTED: dict[str, str] = {
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected a boolean",
    "bool_parsing": "expected a boolean",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "tuple_type": "expected a tuple",
    "set_type": "expected a set",
    "dict_type": "expected a mapping",
    "none_required": "expected null (None)",
}


class Config(BaseModel):
    """Base class of ember's configs: declarative, typed, frozen and saved as JSON.

    Subclasses declare fields with type annotations and optional defaults. Fields
    without a default are required; they may also be passed positionally, in
    declaration order, as Burn's generated ``new`` takes them. For every field
    ``name`` there is a builder ``with_name(value)`` that returns a new validated
    config.

    Args:
        *args: values of the required fields, in declaration order.
        **kwargs: values of any fields by name.

    Raises:
        ConfigError: a value of the wrong type, a missing required field or an
            unknown field; the message names the field path.

    Example:
        >>> from ember import Config
        >>> class OptimConfig(Config):
        ...     lr: float = 1e-3
        ...     betas: tuple[float, float] = (0.9, 0.999)
        >>> class TrainingConfig(Config):
        ...     optimizer: OptimConfig = OptimConfig()
        ...     epochs: int = 10
        >>> config = TrainingConfig().with_epochs(3)
        >>> config.with_optimizer(config.optimizer.with_lr(0.1)).optimizer.lr
        0.1
        >>> config.to_dict()
        {'optimizer': {'lr': 0.001, 'betas': [0.9, 0.999]}, 'epochs': 3}
    """

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        strict=True,
        validate_default=True,
        protected_namespaces=(),
        ser_json_inf_nan="constants",
    )

    _json_indent: ClassVar[int] = 2

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        if args:
            required = [name for name, field in cls.model_fields.items() if field.is_required()]
            if len(args) > len(required):
                raise ConfigError(
                    f"{cls.__name__}: takes at most {len(required)} positional value(s) "
                    f"(the required fields {', '.join(required) or 'none'}), got {len(args)}"
                )
            for name, value in zip(required, args):
                if name in kwargs:
                    raise ConfigError(
                        f"{cls.__name__}.{name}: given both positionally and by name",
                        fields=(f"{cls.__name__}.{name}",),
                    )
                kwargs[name] = value
        try:
            super().__init__(**kwargs)
        except pydantic.ValidationError as error:
            raise _config_error(cls, error, None) from None

    # Tells pydantic this __init__ only forwards to its own, so loading (model_validate,
    # model_validate_json) validates directly instead of calling __init__ with raw data.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """Adds a ``with_<field>`` builder for every field the class does not define itself."""
        super().__pydantic_init_subclass__(**kwargs)
        for name in cls.model_fields:
            builder = f"with_{name}"
            if builder not in cls.__dict__ and not _defined_by_user(cls, builder):
                setattr(cls, builder, _make_builder(name))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("with_") and not name.startswith("with__"):
            cls = type(self)
            known = ", ".join(cls.model_fields) or "none"
            raise AttributeError(
                f"{cls.__name__} has no field {name[5:]!r}, so no {name}() builder "
                f"(known fields: {known})"
            )
        return super().__getattr__(name)  # type: ignore[misc]

    def __setattr__(self, name: str, value: Any) -> None:
        cls = type(self)
        if name in cls.model_fields:
            hint = f"use with_{name}(...) to get a changed copy"
        else:
            hint = f"and has no field {name!r} (known fields: {', '.join(cls.model_fields)})"
        raise AttributeError(f"{cls.__name__} is frozen: {hint}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: fields cannot be deleted")

    def __str__(self) -> str:
        return repr(self)

    # ----------------------------------------------------------------- plain data

    def to_dict(self) -> dict[str, Any]:
        """Returns the config as JSON-ready plain data (what :meth:`save` writes).

        Nested configs become dicts, tuples become lists and enums their values.

        Example:
            >>> from ember import Config
            >>> class A(Config):
            ...     sizes: tuple[int, ...] = (1, 2)
            >>> A().to_dict()
            {'sizes': [1, 2]}
        """
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls: type[C], data: Mapping[str, Any]) -> C:
        """Builds and validates a config from plain data, as :meth:`to_dict` returns it.

        The data is checked with the same rules as a JSON file: lists fill tuple
        fields, enum values fill enum fields, nested dicts fill nested configs.

        Args:
            data: a mapping from field names to values.

        Raises:
            ConfigError: the data does not validate, or is not plain data.

        Example:
            >>> from ember import Config
            >>> class A(Config):
            ...     sizes: tuple[int, int] = (1, 2)
            >>> A.from_dict({"sizes": [3, 4]})
            A(sizes=(3, 4))
        """
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"{cls.__name__}: expected a mapping of field names to values, "
                f"got {_short_repr(data)}"
            )
        try:
            text = pydantic_core.to_json(dict(data), inf_nan_mode="constants")
        except pydantic_core.PydanticSerializationError as error:
            raise ConfigError(f"{cls.__name__}: the data is not plain data: {error}") from None
        return cls._validate_json(text, None)

    # ----------------------------------------------------------------------- JSON

    def to_json(self) -> str:
        """Returns the config as pretty JSON text (two-space indent, fields in order).

        Example:
            >>> from ember import Config
            >>> class A(Config):
            ...     x: int = 1
            >>> print(A().to_json())
            {
              "x": 1
            }
        """
        return self.model_dump_json(indent=self._json_indent)

    @classmethod
    def load_json(cls: type[C], text: str | bytes) -> C:
        """Builds and validates a config from JSON text.

        Args:
            text: the JSON document (a single object).

        Raises:
            ConfigError: the text is not valid JSON or the config does not validate.

        Example:
            >>> from ember import Config
            >>> class A(Config):
            ...     x: int = 1
            >>> A.load_json('{"x": 5}')
            A(x=5)
        """
        return cls._validate_json(text, None)

    def save(self, path: PathLike) -> None:
        """Writes the config to ``path`` as pretty JSON, atomically.

        The text goes to a temporary file in the same directory, which then replaces
        ``path`` in one step: a crash leaves either the old file or the new one,
        never a truncated file.

        Args:
            path: the file to write; its directory must exist.

        Raises:
            ConfigFileNotFoundError: the directory of ``path`` does not exist.

        Example:
            >>> import tempfile, pathlib
            >>> from ember import Config
            >>> class A(Config):
            ...     x: int = 1
            >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.json"
            >>> A(x=2).save(path)
            >>> A.load(path)
            A(x=2)
        """
        path = Path(path)
        parent = path.parent
        if not parent.is_dir():
            raise ConfigFileNotFoundError(
                f"cannot save {type(self).__name__} to '{path}': "
                f"the directory '{parent}' does not exist",
                file=str(path),
            )
        atomic_write(path, (self.to_json() + "\n").encode("utf-8"))

    @classmethod
    def load(cls: type[C], path: PathLike) -> C:
        """Reads and validates a config saved with :meth:`save`.

        Args:
            path: the JSON file.

        Raises:
            ConfigFileNotFoundError: the file does not exist.
            ConfigError: the file is not valid JSON or the config does not validate;
                the message names the field path and the file.

        Example:
            >>> import tempfile, pathlib
            >>> from ember import Config
            >>> class A(Config):
            ...     x: int = 1
            >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.json"
            >>> A().save(path)
            >>> A.load(path) == A()
            True
        """
        path = Path(path)
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            raise ConfigFileNotFoundError(
                f"cannot load {cls.__name__}: the file '{path}' does not exist", file=str(path)
            ) from None
        except IsADirectoryError:
            raise ConfigError(
                f"cannot load {cls.__name__}: '{path}' is a directory", file=str(path)
            ) from None
        return cls._validate_json(text, str(path))

    # ------------------------------------------------------------------- internals

    @classmethod
    def _validate_json(cls: type[C], text: str | bytes, file: str | None) -> C:
        try:
            return cls.model_validate_json(text)
        except pydantic.ValidationError as error:
            raise _config_error(cls, error, file) from None

    def _with(self: C, name: str, value: Any) -> C:
        cls = type(self)
        values = {field: getattr(self, field) for field in cls.model_fields}
        values[name] = value
        try:
            return cls.model_validate(values)
        except pydantic.ValidationError as error:
            raise _config_error(cls, error, None) from None


def _defined_by_user(cls: type, attribute: str) -> bool:
    """True when a base class defines ``attribute`` by hand (not as a generated builder)."""
    for base in cls.__mro__[1:]:
        found = base.__dict__.get(attribute)
        if found is not None:
            return not getattr(found, "_ember_generated", False)
    return False


def _make_builder(name: str) -> Callable[[Config, Any], Config]:
    def builder(self: Config, value: Any) -> Config:
        return self._with(name, value)

    builder.__name__ = builder.__qualname__ = f"with_{name}"
    builder.__doc__ = (
        f"Returns a new, validated copy of this config with ``{name}`` set to ``value``."
    )
    builder._ember_generated = True  # type: ignore[attr-defined]
    return builder


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _config_class_at(cls: type[Config], loc: tuple[Any, ...]) -> type[Config] | None:
    """The config class that holds the field at ``loc`` (for listing its known fields)."""
    current: type[Config] | None = cls
    for part in loc[:-1]:
        if current is None or not isinstance(part, str) or part not in current.model_fields:
            return None
        current = _config_in(current.model_fields[part].annotation)
    return current


def _config_in(annotation: Any) -> type[Config] | None:
    if isinstance(annotation, type) and issubclass(annotation, Config):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        for member in typing.get_args(annotation):
            found = _config_in(member)
            if found is not None:
                return found
    return None


def _field_path(cls: type[Config], loc: tuple[Any, ...]) -> str:
    path = cls.__name__
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _describe(cls: type[Config], error: Mapping[str, Any]) -> str:
    kind = error["type"]
    value = error.get("input")
    loc = tuple(error.get("loc", ()))
    if kind == "missing":
        return "missing required field"
    if kind == "extra_forbidden":
        owner = _config_class_at(cls, loc)
        known = ", ".join(owner.model_fields) if owner is not None else "?"
        return f"unknown field (known fields: {known or 'none'})"
    if kind == "json_invalid":
        detail = (error.get("ctx") or {}).get("error", error["msg"])
        return f"malformed JSON: {detail}"
    if kind in _EXPECTED:
        return f"{_EXPECTED[kind]}, got {_short_repr(value)}"
    message = str(error["msg"])
    if message.startswith("Input should be "):
        message = "expected " + message[len("Input should be ") :]
    else:
        message = message[:1].lower() + message[1:]
    return f"{message}, got {_short_repr(value)}"


def _config_error(
    cls: type[Config], error: pydantic.ValidationError, file: str | None
) -> ConfigError:
    """Turns pydantic's ValidationError into a ConfigError naming field paths and the file."""
    where = f" (in {file})" if file is not None else ""
    fields: list[str] = []
    lines: list[str] = []
    for item in error.errors(include_url=False):
        loc = tuple(item.get("loc", ()))
        path = _field_path(cls, loc)
        fields.append(path)
        lines.append(f"{path}: {_describe(cls, item)}")
    if len(lines) == 1:
        message = lines[0] + where
    else:
        message = f"{cls.__name__}: {len(lines)} errors{where}\n" + "\n".join(
            "  " + line for line in lines
        )
    return ConfigError(message, fields=tuple(fields), file=file)
