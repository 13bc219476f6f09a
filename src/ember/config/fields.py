"""Constrained field types that configs share.

Configs validate in pydantic's strict mode, where a list is not a tuple; the tuple
types here also take a list, as Burn's book and JSON write sizes (``[3, 3]``), and
keep it as a tuple. Build more with ``Annotated[tuple[...], AS_TUPLE]``.

Example:
    >>> from ember import Config
    >>> from ember.config.fields import PositivePair, Probability
    >>> class PoolConfig(Config):
    ...     kernel_size: PositivePair
    ...     dropout: Probability = 0.0
    >>> PoolConfig([2, 2]).kernel_size
    (2, 2)
    >>> PoolConfig((2, 0))
    Traceback (most recent call last):
    ...
    ember.backend.errors.ConfigError: PoolConfig.kernel_size[1]: expected greater than or equal to 1, got 0
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
Probability = Annotated[float, Field(ge=0, le=1)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


def list_as_tuple(value: Any) -> Any:
    """A list as a tuple (for tuple fields in strict mode); anything else as it is."""
    return tuple(value) if isinstance(value, list) else value


AS_TUPLE = BeforeValidator(list_as_tuple)

# Sizes per spatial dim.
PositivePair = Annotated[tuple[PositiveInt, PositiveInt], AS_TUPLE]
PositiveTriple = Annotated[tuple[PositiveInt, PositiveInt, PositiveInt], AS_TUPLE]
NonNegativePair = Annotated[tuple[NonNegativeInt, NonNegativeInt], AS_TUPLE]
NonNegativeTriple = Annotated[tuple[NonNegativeInt, NonNegativeInt, NonNegativeInt], AS_TUPLE]
NonNegativeInts = Annotated[tuple[NonNegativeInt, ...], AS_TUPLE]
