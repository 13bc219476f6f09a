"""Seeds for the random transforms: a given seed always gives the same order."""

from __future__ import annotations

import numpy as np

from ember.backend.errors import ArgumentError


def resolve_seed(seed: int | None, owner: str) -> int:
    """``seed``, checked, or a fresh random one when ``None`` (kept by the dataset, so
    that its order stays fixed for its lifetime)."""
    if seed is None:
        return int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> np.uint64(1))
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ArgumentError(f"{owner}: seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def generator(seed: int, *stream: int) -> np.random.Generator:
    """A generator for the sub-stream ``stream`` of ``seed`` (independent for each
    distinct ``stream``)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, *stream])))


def check_dataset(dataset: object, owner: str) -> None:
    from ember.data.dataset.base import Dataset

    if not isinstance(dataset, Dataset):
        raise ArgumentError(f"{owner}: expected a Dataset, got {type(dataset).__name__}")


def check_size(value: object, owner: str, field: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ArgumentError(f"{owner}: {field} must be an integer >= {minimum}, got {value!r}")
    return int(value)
