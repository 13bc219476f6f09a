"""Field types of the optimizer configs (the general ones are in ``ember.config.fields``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

# A decay rate of a running average: 0 keeps nothing of the past, 1 would never update.
Beta = Annotated[float, Field(ge=0, lt=1)]
# A share of the gradient (dampening) or of the old average (RMSProp's alpha).
UnitFloat = Annotated[float, Field(ge=0, le=1)]
