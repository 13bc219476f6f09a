"""The host's CPU usage, memory and temperature, read with psutil.

These metrics need no input from the step's output. Their value is the latest reading,
not a mean over the epoch; readings are refreshed at most every ``refresh_interval``
seconds, because the learner updates metrics every iteration and reading the system that
often costs time and gives noisy usage figures.
"""

from __future__ import annotations

import time
from typing import Any

from ember.backend.errors import ArgumentError, BackendUnavailableError
from ember.train.metric.base import Metric, MetricEntry, MetricMetadata, Numeric

#: Seconds between two readings of the system, by default.
REFRESH_INTERVAL = 0.5

#: The sensors psutil names for CPUs (Intel, AMD, Raspberry Pi and ACPI), most specific first.
_CPU_SENSORS = ("coretemp", "k10temp", "zenpower", "cpu_thermal", "cpu-thermal", "acpitz")
#: The labels of a chip's reading of the whole package (else its hottest reading is used).
_PACKAGE_LABELS = ("Package", "Tctl", "Tdie")


def _psutil() -> Any:
    try:
        import psutil
    except ImportError:
        raise BackendUnavailableError(
            "the CPU metrics need psutil, which is not installed (pip install psutil)"
        ) from None
    return psutil


class _SystemMetric(Numeric, Metric):
    """A reading of the system, refreshed at most every ``refresh_interval`` seconds."""

    input_type = None
    lower_is_better = True

    def __init__(self, refresh_interval: float = REFRESH_INTERVAL) -> None:
        if not refresh_interval >= 0:
            raise ArgumentError(
                f"{type(self).__name__}: refresh_interval must be >= 0 seconds, "
                f"got {refresh_interval}"
            )
        self.refresh_interval = refresh_interval
        self._psutil = _psutil()
        self._read_at = float("-inf")
        self._value = float("nan")

    def update(self, item: None, metadata: MetricMetadata) -> MetricEntry:
        now = time.monotonic()
        if now - self._read_at >= self.refresh_interval:
            self._read_at = now
            self._refresh()
        return MetricEntry(self.name, self._formatted(), repr(self._value))

    def clear(self) -> None:
        """Nothing to forget: a reading does not depend on the epoch."""

    def value(self) -> float:
        return self._value

    def _refresh(self) -> None:
        raise NotImplementedError

    def _formatted(self) -> str:
        raise NotImplementedError


class CpuUse(_SystemMetric):
    """The usage of all the host's CPUs together since the previous reading, in percent.

    Args:
        refresh_interval: the least seconds between two readings (the usage is measured
            over that time).

    Example:
        >>> from ember.train.metric.base import MetricMetadata, Progress
        >>> metric = CpuUse()
        >>> entry = metric.update(None, MetricMetadata(Progress(1, 1), 1, 1, 1))
        >>> entry.name, 0.0 <= metric.value() <= 100.0
        ('CPU Usage', True)
    """

    name = "CPU Usage"

    def __init__(self, refresh_interval: float = REFRESH_INTERVAL) -> None:
        super().__init__(refresh_interval)
        # psutil measures from one call to the next: this first call starts the clock.
        self._psutil.cpu_percent(interval=None)

    def _refresh(self) -> None:
        self._value = float(self._psutil.cpu_percent(interval=None))

    def _formatted(self) -> str:
        return f"{self._value:.2f}%"


class CpuMemory(_SystemMetric):
    """The host's memory in use (all but what is available), in GB (10⁹ bytes).

    Shown as ``"used/total GB (percent%)"``; its value is the GB in use.

    Args:
        refresh_interval: the least seconds between two readings.

    Example:
        >>> from ember.train.metric.base import MetricMetadata, Progress
        >>> metric = CpuMemory()
        >>> entry = metric.update(None, MetricMetadata(Progress(1, 1), 1, 1, 1))
        >>> entry.name, 0.0 < metric.value() <= metric.total
        ('CPU Memory', True)
    """

    name = "CPU Memory"

    def __init__(self, refresh_interval: float = REFRESH_INTERVAL) -> None:
        super().__init__(refresh_interval)
        self.total = float("nan")

    def _refresh(self) -> None:
        memory = self._psutil.virtual_memory()
        self.total = memory.total / 1e9
        self._value = (memory.total - memory.available) / 1e9

    def _formatted(self) -> str:
        percent = 100.0 * self._value / self.total if self.total else float("nan")
        return f"{self._value:.2f}/{self.total:.2f} GB ({percent:.2f}%)"


class CpuTemperature(_SystemMetric):
    """The temperature of the host's CPU package, in °C, where a sensor reports it.

    It reads psutil's CPU sensors (``coretemp``, ``k10temp``, ...): the package reading
    when the chip has one, else its hottest. Where there is none (containers, virtual
    machines, macOS, Windows) every update says so and the value is NaN: the metric can
    stay registered on any machine. ``available`` tells which case holds.

    Args:
        refresh_interval: the least seconds between two readings.

    Example:
        >>> from ember.train.metric.base import MetricMetadata, Progress
        >>> metric = CpuTemperature()
        >>> entry = metric.update(None, MetricMetadata(Progress(1, 1), 1, 1, 1))
        >>> entry.name, metric.available == (entry.serialized != "nan")
        ('CPU Temperature', True)
    """

    name = "CPU Temperature"

    def __init__(self, refresh_interval: float = REFRESH_INTERVAL) -> None:
        super().__init__(refresh_interval)
        self.available = False

    def _refresh(self) -> None:
        reading = self._reading()
        self.available = reading is not None
        self._value = float("nan") if reading is None else float(reading)

    def _reading(self) -> float | None:
        sensors = getattr(self._psutil, "sensors_temperatures", None)
        if sensors is None:  # psutil has no sensors on this platform
            return None
        try:
            chips = sensors()
        except OSError:
            return None
        for chip in _CPU_SENSORS:
            readings = [r for r in chips.get(chip, ()) if r.current is not None]
            if readings:
                package = [r for r in readings if r.label.startswith(_PACKAGE_LABELS)]
                return (package[0] if package else max(readings, key=lambda r: r.current)).current
        return None

    def _formatted(self) -> str:
        if not self.available:
            return "unavailable (no CPU temperature sensor)"
        return f"{self._value:.1f}°C"
