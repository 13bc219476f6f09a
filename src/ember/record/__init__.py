"""Records: what ember saves and loads (module weights, optimizer state), and weight import.

A record is plain data: nested dicts (string keys), lists, strings, numbers,
booleans, ``None``, bytes and :class:`~ember.TensorData` leaves. Recorders turn
records into files or bytes at a chosen precision; importers read weight files
other tools wrote (safetensors, PyTorch) without running code from them.
"""

from ember.record.adapter import PYTORCH, Adapter
from ember.record.imported import ImportedRecord, KeyRemap
from ember.record.importers import LoadArgs, PyTorchFileRecorder, SafetensorsFileRecorder
from ember.record.precision import (
    BF16Precision,
    DoublePrecision,
    FullPrecision,
    HalfPrecision,
    PrecisionSettings,
)
from ember.record.recorder import (
    BinBytesRecorder,
    BinFileRecorder,
    BinGzFileRecorder,
    CompactRecorder,
    DefaultRecorder,
    FileRecorder,
    JsonGzFileRecorder,
    NamedMpkFileRecorder,
    NamedMpkGzFileRecorder,
    PrettyJsonFileRecorder,
    Recorder,
    SensitiveCompactRecorder,
)
from ember.record.weight_limits import WeightLimits

__all__ = [
    "PYTORCH", "Adapter", "BF16Precision", "BinBytesRecorder", "BinFileRecorder",
    "BinGzFileRecorder", "CompactRecorder", "DefaultRecorder", "DoublePrecision", "FileRecorder",
    "FullPrecision", "HalfPrecision", "ImportedRecord", "JsonGzFileRecorder", "KeyRemap",
    "LoadArgs", "NamedMpkFileRecorder", "NamedMpkGzFileRecorder", "PrecisionSettings",
    "PrettyJsonFileRecorder", "PyTorchFileRecorder", "Recorder", "SafetensorsFileRecorder",
    "SensitiveCompactRecorder", "WeightLimits",
]  # fmt: skip
