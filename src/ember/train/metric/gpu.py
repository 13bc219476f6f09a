"""NVIDIA GPU usage, memory and temperature, read through NVML (the optional ``pynvml``).

``pynvml`` comes with the ``nvidia-ml-py`` package. Without it, without a driver or
without a GPU, these metrics still build and update: each entry says why nothing can be
read (``"unavailable (pynvml is not installed ...)"``), the value is NaN, and nothing
raises, so a training script can register them on any machine. :func:`nvml_unavailable`
gives the reason, or None when NVML can be read.

As the CPU metrics, they need no input and their value is the latest reading, refreshed
at most every ``refresh_interval`` seconds.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ember.backend.errors import ArgumentError
from ember.train.metric.base import Metric, MetricEntry, MetricMetadata, Numeric
from ember.train.metric.cpu import REFRESH_INTERVAL


class _Unavailable(Exception):
    """NVML cannot be read; the message says why."""


_LOCK = threading.Lock()
#: pynvml once NVML has started, or the reason it cannot (NVML starts once per process).
_SESSION: Any = None


def _nvml() -> Any:
    global _SESSION
    with _LOCK:
        if _SESSION is None:
            try:
                import pynvml
            except ImportError:
                _SESSION = _Unavailable("pynvml is not installed: pip install nvidia-ml-py")
            else:
                try:
                    pynvml.nvmlInit()
                    _SESSION = pynvml
                except Exception as error:  # NVMLError and the like: no driver, no library
                    _SESSION = _Unavailable(f"NVML could not start: {error}")
    if isinstance(_SESSION, _Unavailable):
        raise _SESSION
    return _SESSION


def _handle(index: int) -> tuple[Any, Any]:
    nvml = _nvml()
    count = nvml.nvmlDeviceGetCount()
    if count == 0:
        raise _Unavailable("NVML finds no GPU")
    if index >= count:
        raise _Unavailable(f"there is no GPU {index}: NVML finds {count}")
    return nvml, nvml.nvmlDeviceGetHandleByIndex(index)


def nvml_unavailable(index: int = 0) -> str | None:
    """Why GPU ``index`` cannot be read through NVML, or None when it can.

    Example:
        >>> reason = nvml_unavailable()
        >>> reason is None or isinstance(reason, str)
        True
    """
    try:
        _handle(index)
    except _Unavailable as error:
        return str(error)
    return None


class _GpuMetric(Numeric, Metric):
    """A reading of one GPU; ``reason`` says why there is none (None when there is)."""

    input_type = None
    lower_is_better = True
    _label: str

    def __init__(self, device_index: int = 0, refresh_interval: float = REFRESH_INTERVAL) -> None:
        owner = type(self).__name__
        if isinstance(device_index, bool) or not isinstance(device_index, int) or device_index < 0:
            raise ArgumentError(f"{owner}: device_index must be an int >= 0, got {device_index!r}")
        if not refresh_interval >= 0:
            raise ArgumentError(
                f"{owner}: refresh_interval must be >= 0 seconds, got {refresh_interval}"
            )
        self.device_index = device_index
        self.refresh_interval = refresh_interval
        # Each GPU's metrics get their own name, hence their own log file.
        suffix = f" #{device_index}" if device_index else ""
        self.name = self._label + suffix
        self.reason: str | None = None
        self._read_at = float("-inf")
        self._value = float("nan")

    def update(self, item: None, metadata: MetricMetadata) -> MetricEntry:
        now = time.monotonic()
        if now - self._read_at >= self.refresh_interval:
            self._read_at = now
            try:
                nvml, handle = _handle(self.device_index)
                self._value = float(self._read(nvml, handle))
                self.reason = None
            except _Unavailable as error:
                self._value, self.reason = float("nan"), str(error)
            except Exception as error:  # an NVMLError: the GPU does not report this reading
                self._value, self.reason = float("nan"), f"NVML: {error}"
        if self.reason is not None:
            return MetricEntry(self.name, f"unavailable ({self.reason})", "nan")
        return MetricEntry(self.name, self._formatted(), repr(self._value))

    def clear(self) -> None:
        """Nothing to forget: a reading does not depend on the epoch."""

    def value(self) -> float:
        return self._value

    def _read(self, nvml: Any, handle: Any) -> float:
        raise NotImplementedError

    def _formatted(self) -> str:
        raise NotImplementedError


class GpuUse(_GpuMetric):
    """The share of the last sample period during which a kernel ran on the GPU, in percent.

    Args:
        device_index: the GPU, as NVML numbers them (the name gets `` #i`` past GPU 0).
        refresh_interval: the least seconds between two readings.

    Example:
        >>> from ember.train.metric.base import MetricMetadata, Progress
        >>> metric = GpuUse()
        >>> entry = metric.update(None, MetricMetadata(Progress(1, 1), 1, 1, 1))
        >>> entry.name, (metric.reason is None) == (entry.serialized != "nan")
        ('GPU Usage', True)
    """

    _label = "GPU Usage"

    def _read(self, nvml: Any, handle: Any) -> float:
        return nvml.nvmlDeviceGetUtilizationRates(handle).gpu

    def _formatted(self) -> str:
        return f"{self._value:.2f}%"


class GpuMemory(_GpuMetric):
    """The GPU's memory in use, in GB (10⁹ bytes); shown as ``"used/total GB (percent%)"``.

    Args:
        device_index: the GPU, as NVML numbers them (the name gets `` #i`` past GPU 0).
        refresh_interval: the least seconds between two readings.

    Example:
        >>> GpuMemory(device_index=1).name
        'GPU Memory #1'
    """

    _label = "GPU Memory"

    def __init__(self, device_index: int = 0, refresh_interval: float = REFRESH_INTERVAL) -> None:
        super().__init__(device_index, refresh_interval)
        self.total = float("nan")

    def _read(self, nvml: Any, handle: Any) -> float:
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        self.total = memory.total / 1e9
        return memory.used / 1e9

    def _formatted(self) -> str:
        percent = 100.0 * self._value / self.total if self.total else float("nan")
        return f"{self._value:.2f}/{self.total:.2f} GB ({percent:.2f}%)"


class GpuTemperature(_GpuMetric):
    """The temperature of the GPU's die, in °C.

    Args:
        device_index: the GPU, as NVML numbers them (the name gets `` #i`` past GPU 0).
        refresh_interval: the least seconds between two readings.

    Example:
        >>> GpuTemperature().name
        'GPU Temperature'
    """

    _label = "GPU Temperature"

    def _read(self, nvml: Any, handle: Any) -> float:
        return nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)

    def _formatted(self) -> str:
        return f"{self._value:.1f}°C"


class CudaMetric(Metric):
    """Usage and memory of every GPU NVML sees, as one line of text (not plotted).

    Example:
        >>> from ember.train.metric.base import MetricMetadata, Progress
        >>> entry = CudaMetric().update(None, MetricMetadata(Progress(1, 1), 1, 1, 1))
        >>> entry.name, entry.formatted == entry.serialized
        ('CUDA', True)
    """

    name = "CUDA"
    input_type = None

    def update(self, item: None, metadata: MetricMetadata) -> MetricEntry:
        try:
            nvml = _nvml()
            count = nvml.nvmlDeviceGetCount()
            if count == 0:
                raise _Unavailable("NVML finds no GPU")
            parts = []
            for index in range(count):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                usage = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                parts.append(
                    f"GPU #{index} usage {usage:.2f}% | memory "
                    f"{memory.used / 1e9:.2f}/{memory.total / 1e9:.2f} GB"
                )
            text = "; ".join(parts)
        except _Unavailable as error:
            text = f"unavailable ({error})"
        except Exception as error:  # an NVMLError while reading
            text = f"unavailable (NVML: {error})"
        return MetricEntry(self.name, text, text)

    def clear(self) -> None:
        """Nothing to forget."""
