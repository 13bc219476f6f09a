"""The saved run of ``ember bench``: its JSON schema, written atomically, read defensively.

A run file holds the machine (CPU, cores, versions, git commit), each script's outcome
with the tables it recorded, and the results read from them: one per benchmark, case and
implementation, with its seconds and its reference's. A run file may come from anywhere
(another machine, an edited copy), so reading it checks everything: the size, the JSON,
every field's type and bounds (pydantic, extra fields refused), and the schema version;
any problem is a :class:`BenchFileError` naming the file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ember.atomic import atomic_write
from ember.backend.errors import EmberError

SCHEMA = "ember-bench/1"
MAX_FILE_BYTES = 64 << 20
"""A run file larger than this is refused before it is parsed (a real run is < 1 MB)."""

Text = Annotated[str, Field(max_length=2000)]
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class BenchFileError(EmberError, ValueError):
    """A run file that cannot be read: missing, too large, not JSON, or not the schema."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Table(_Strict):
    """A table a benchmark printed: its title, header and rows, as text."""

    title: Text
    header: Annotated[list[Text], Field(max_length=64)]
    rows: Annotated[list[Annotated[list[Text], Field(max_length=64)]], Field(max_length=100_000)]


class ScriptRun(_Strict):
    """One script's outcome: ``ok``, ``failed`` (the reason: its error) or ``skipped``."""

    name: Text
    args: Annotated[list[Text], Field(max_length=100)]
    status: Literal["ok", "failed", "skipped"]
    reason: Text = ""
    wall_seconds: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    tables: Annotated[list[Table], Field(max_length=1000)] = []


class Result(_Strict):
    """One implementation's time on one case, and its reference's on the same case."""

    benchmark: Text
    case: Text
    impl: Text
    backend: Text | None
    seconds: Seconds
    reference: Text | None = None
    reference_seconds: Seconds | None = None

    @property
    def ratio(self) -> float | None:
        """Seconds over the reference's seconds (below 1: faster than the reference)."""
        return None if self.reference_seconds is None else self.seconds / self.reference_seconds

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.benchmark, self.case, self.impl)


class BenchRun(_Strict):
    """A whole ``ember bench`` run, as saved."""

    model_config = ConfigDict(populate_by_name=True)

    schema_: Literal["ember-bench/1"] = Field(SCHEMA, alias="schema")
    created: Text
    machine: Annotated[dict[Text, Text], Field(max_length=100)]
    threads: Annotated[int, Field(ge=1, le=4096)]
    scripts: Annotated[list[ScriptRun], Field(max_length=1000)]
    results: Annotated[list[Result], Field(max_length=1_000_000)]


def save_run(run: BenchRun, path: str | Path) -> Path:
    """Writes ``run`` to ``path`` as JSON (atomically: a crash leaves no partial file)."""
    path = Path(path)
    text = json.dumps(run.model_dump(mode="json", by_alias=True), indent=1)
    atomic_write(path, text.encode("utf-8"))
    return path


def load_run(path: str | Path) -> BenchRun:
    """Reads a run file written by :func:`save_run`.

    Raises:
        BenchFileError: the file is missing, larger than :data:`MAX_FILE_BYTES`, not
            UTF-8 JSON, another schema, or a field has the wrong type or bounds.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise BenchFileError(
                f"{path}: {size} bytes is larger than a benchmark run file may be "
                f"({MAX_FILE_BYTES} bytes)"
            )
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise BenchFileError(f"{path}: cannot read the run file: {error.strerror or error}") \
            from error  # fmt: skip
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise BenchFileError(f"{path}: not a JSON run file: {error}") from error
    if not isinstance(data, dict):
        raise BenchFileError(f"{path}: a run file is a JSON object, got {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise BenchFileError(
            f"{path}: schema {data.get('schema')!r} is not {SCHEMA!r} (not an ember bench run, "
            "or one from another version)"
        )
    try:
        return BenchRun.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise BenchFileError(
            f"{path}: field {where}: {first['msg']} ({error.error_count()} error(s) in all)"
        ) from error


def _no_constant(name: str) -> float:
    # json accepts NaN and Infinity, which are not JSON; a time is never one
    raise ValueError(f"{name} is not a valid JSON number")
