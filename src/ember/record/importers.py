"""Recorders for weight files other tools write: PyTorch state dicts and safetensors.

Both give an :class:`~ember.record.imported.ImportedRecord`, which
``Module.load_record`` loads with the source's layout adapter applied, so the
book's workflow reads::

    record = PyTorchFileRecorder().load(LoadArgs("conv2d.pt").with_key_remap(r"conv\\.(.*)", "$1"))
    model = ModelConfig().init(device).load_record(record)

Neither needs torch: PyTorch files are read by ember's own restricted
unpickler (see :mod:`ember.record.pytorch`), which never runs code from a file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ember.backend.errors import RecordFormatError
from ember.record.adapter import PYTORCH, Adapter
from ember.record.imported import ImportedRecord, KeyRemap, flatten
from ember.record.limits import describe
from ember.record.precision import PrecisionSettings
from ember.record.weight_limits import WeightLimits
from ember.tensor import TensorData

PathLike = str | Path

_IDS_KEY = "ember.param_ids"


@dataclass(frozen=True)
class LoadArgs:
    """Where and how to read a weight file.

    Args:
        path: the file.
        key_remaps: renaming rules applied to every tensor name, in order.
        top_level_key: for checkpoints that nest the state dict (``{"model": ..., "epoch": 3}``),
            the key that holds it.
        adapter: the layout rules of the source framework; ``PYTORCH`` by default.
    """

    path: PathLike
    key_remaps: tuple[KeyRemap, ...] = ()
    top_level_key: str | None = None
    adapter: Adapter | None = PYTORCH

    def with_key_remap(self, pattern: str, replacement: str) -> LoadArgs:
        """Renames tensors matching ``pattern`` (``$1`` refers to a group, as in the book)."""
        return replace(self, key_remaps=(*self.key_remaps, KeyRemap(pattern, replacement)))

    def with_top_level_key(self, key: str) -> LoadArgs:
        return replace(self, top_level_key=key)

    def with_adapter(self, adapter: Adapter | None) -> LoadArgs:
        return replace(self, adapter=adapter)


def _args(args: LoadArgs | PathLike, adapter: Adapter | None) -> LoadArgs:
    return args if isinstance(args, LoadArgs) else LoadArgs(args, adapter=adapter)


def _imported(tensors: dict[str, Any], args: LoadArgs, precision: PrecisionSettings | None) -> ImportedRecord:
    if precision is not None:
        tensors = {name: precision.convert(value, name) if isinstance(value, TensorData) else value
                   for name, value in tensors.items()}
    return ImportedRecord(tensors, args.adapter, str(args.path), args.key_remaps)


class PyTorchFileRecorder:
    """Reads ``.pt`` / ``.pth`` / ``.bin`` files written by ``torch.save`` (no torch needed).

    Args:
        precision: converts every tensor to these settings' dtypes when given; by default
            tensors keep the file's dtypes and the module converts them on load.
        limits: ceilings on memory a file may take beyond its own bytes (tensors expanded
            by stride 0, compressed entries); raise them only for files you trust.

    Example:
        >>> import tempfile, pathlib, torch
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "w.pt"
        >>> torch.save({"conv.weight": torch.ones(2, 3)}, path)
        >>> record = PyTorchFileRecorder().load(LoadArgs(path).with_key_remap(r"conv\\.", ""))
        >>> record.names()
        ['weight']
    """

    def __init__(
        self, precision: PrecisionSettings | None = None, limits: WeightLimits | None = None
    ) -> None:
        self.precision = precision
        self.limits = limits

    def load(self, args: LoadArgs | PathLike) -> ImportedRecord:
        from ember.record.pytorch import read_pytorch

        args = _args(args, PYTORCH)
        tensors = read_pytorch(args.path, top_level_key=args.top_level_key, limits=self.limits)
        return _imported(tensors, args, self.precision)


class SafetensorsFileRecorder:
    """Reads and writes safetensors files (the Hugging Face format: a JSON header, raw bytes).

    Files ember writes keep each parameter's id in the header metadata, so
    optimizer state still matches after a round trip. Files from elsewhere are
    assumed to have PyTorch's layout unless ``LoadArgs(adapter=None)`` says otherwise.

    Args:
        precision: the dtypes tensors are saved as (and, when given, loaded as).
        limits: ceilings on what a file may make ember allocate (the header's size).
    """

    extension = "safetensors"

    def __init__(
        self, precision: PrecisionSettings | None = None, limits: WeightLimits | None = None
    ) -> None:
        self.precision = precision
        self.limits = limits

    def save(self, record: Any, path: PathLike) -> Path:
        """Writes the tensors of ``record`` (a module record or a Module) under dotted names."""
        from ember.record.safetensors import write_safetensors

        if hasattr(record, "into_record"):
            record = record.into_record()
        path = Path(path)
        if not path.name.endswith("." + self.extension):
            path = path.with_name(f"{path.name}.{self.extension}")
        tensors = flatten(record)
        if self.precision is not None:
            tensors = {name: self.precision.convert(data, name) for name, data in tensors.items()}
        ids = {name: leaf["id"] for name, leaf in _param_leaves(record)}
        write_safetensors(path, tensors, {_IDS_KEY: json.dumps(ids)} if ids else None)
        return path

    def load(self, args: LoadArgs | PathLike) -> ImportedRecord:
        from ember.record.safetensors import read_safetensors

        args = _args(args, PYTORCH)
        path = Path(args.path)
        if not path.exists() and path.with_name(f"{path.name}.{self.extension}").exists():
            args = replace(args, path=path.with_name(f"{path.name}.{self.extension}"))
        tensors, metadata = read_safetensors(args.path, limits=self.limits)
        if _IDS_KEY in metadata:
            ids = _param_ids(metadata[_IDS_KEY], str(args.path))
            # ember wrote it: the names and layout are ember's own
            args = replace(args, adapter=None)
            tensors = {name: {"id": ids[name], "param": data} if name in ids else data
                       for name, data in tensors.items()}
        return _imported(tensors, args, self.precision)


def _param_ids(text: str, source: str) -> dict[str, str]:
    """The parameter ids ember keeps in a file's metadata: a JSON object of name to id string."""
    try:
        ids = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise RecordFormatError(f"{source}: the metadata {_IDS_KEY!r} is not JSON: "
                                f"{describe(str(exc))}", file=source) from None  # fmt: skip
    if not isinstance(ids, dict) or not all(type(v) is str for v in ids.values()):
        raise RecordFormatError(f"{source}: the metadata {_IDS_KEY!r} is {describe(ids)}, not a map "
                                "of names to ids", file=source)  # fmt: skip
    return ids


def _param_leaves(record: Any, path: str = ""):
    if isinstance(record, dict) and "param" in record and isinstance(record["param"], TensorData):
        yield path, record
        return
    items = record.items() if isinstance(record, dict) else enumerate(record or ())
    if isinstance(record, dict | list | tuple):
        for key, value in items:
            yield from _param_leaves(value, f"{path}.{key}" if path else str(key))

