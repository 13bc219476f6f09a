"""Constrained field types of the optimizer configs."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

NonNegativeFloat = Annotated[float, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
# A decay rate of a running average: 0 keeps nothing of the past, 1 would never update.
Beta = Annotated[float, Field(ge=0, lt=1)]
UnitFloat = Annotated[float, Field(ge=0, le=1)]
