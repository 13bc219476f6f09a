"""Small pieces the layers share: constrained config field types, the training switch."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from ember.backend.device import Device

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]


def _list_as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


# Sizes per spatial dim: a tuple, or a list as Burn's book and JSON write them ([3, 3]).
PositivePair = Annotated[tuple[PositiveInt, PositiveInt], BeforeValidator(_list_as_tuple)]
NonNegativeInts = Annotated[tuple[NonNegativeInt, ...], BeforeValidator(_list_as_tuple)]


def is_training(device: Device) -> bool:
    """Whether layers run in training mode on ``device``.

    As in Burn, the backend decides: on an autodiff device a layer trains
    (batch norm uses the batch's statistics, dropout drops); elsewhere, e.g. after
    ``module.valid()``, it runs for inference.
    """
    return hasattr(device.backend, "backward")
