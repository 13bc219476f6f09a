"""Metric loggers: where the entries of a run's metrics are kept, epoch by epoch.

The learner gives each split (train, valid) a :class:`MetricLogger`. It calls
``log(entry)`` for every metric at every iteration, and ``end_epoch(epoch)`` when the
split's epoch ``epoch`` is done, so that the next entries belong to epoch ``epoch + 1``.
``read_numeric(name, epoch)`` reads a metric's values of an epoch back (the summary at
the end of a run, early stopping and best-checkpoint selection use it).

:class:`FileMetricLogger` writes the files of the book's artifact tree,
``<directory>/epoch-<n>/<name>.log`` with one serialized value per line;
:class:`InMemoryMetricLogger` keeps them in memory, for tests. :func:`experiment_log`
sends ember's log records to ``<artifact_dir>/experiment.log`` during a run.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from ember.backend.errors import ArgumentError
from ember.train.metric.base import MetricEntry


def _check_epoch(owner: str, epoch: int) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
        raise ArgumentError(f"{owner}: epochs count from 1, got {epoch!r}")
    return epoch


def _check_line(owner: str, entry: MetricEntry) -> str:
    if "\n" in entry.serialized or "\r" in entry.serialized:
        raise ArgumentError(
            f"{owner}: the serialized value of {entry.name!r} must be one line, "
            f"got {entry.serialized!r}"
        )
    return entry.serialized


def _parse(owner: str, values: list[str], where: str) -> list[float]:
    numbers = []
    for line, text in enumerate(values, 1):
        try:
            numbers.append(float(text))
        except ValueError:
            raise ArgumentError(
                f"{owner}: {where} holds {text!r} on line {line}, not a number "
                "(only numeric metrics can be read back)"
            ) from None
    return numbers


class MetricLogger(abc.ABC):
    """Keeps the entries of one split's metrics, epoch by epoch (see the module docstring)."""

    @abc.abstractmethod
    def log(self, entry: MetricEntry) -> None:
        """Keeps ``entry.serialized`` as the next value of ``entry.name`` in this epoch."""

    @abc.abstractmethod
    def end_epoch(self, epoch: int) -> None:
        """Epoch ``epoch`` is done; the next entries belong to epoch ``epoch + 1``."""

    @abc.abstractmethod
    def read_numeric(self, name: str, epoch: int) -> list[float]:
        """The values of metric ``name`` logged in epoch ``epoch``, in order.

        Raises:
            ArgumentError: nothing was logged for it, or a value is not a number.
        """


class FileMetricLogger(MetricLogger):
    """Writes ``<directory>/epoch-<n>/<name>.log``: one serialized value per line.

    Each line goes to the file in one append (``O_APPEND``, one ``write`` of the whole
    line, no buffering), so a reader of a run in progress (a dashboard, ``tail -f``) sees
    whole lines, and :meth:`read_numeric` leaves out a last line without its newline.

    The first entry of a metric in an epoch starts its file afresh: a run resumed from
    the checkpoint of epoch ``n`` (``end_epoch(n)`` first) rewrites the logs of epoch
    ``n + 1`` that an interrupted run had begun, rather than appending to them.

    Args:
        directory: the split's folder, e.g. ``<artifact_dir>/train``; made when needed.
        epoch: the epoch the first entries belong to.

    Example:
        >>> import tempfile
        >>> from ember.train.metric.base import MetricEntry
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     logger = FileMetricLogger(tmp)
        ...     logger.log(MetricEntry("Loss", "epoch 0.50 - batch 0.50", "0.5"))
        ...     logger.log(MetricEntry("Loss", "epoch 0.40 - batch 0.30", "0.3"))
        ...     logger.end_epoch(1)
        ...     logger.log(MetricEntry("Loss", "epoch 0.20 - batch 0.20", "0.2"))
        ...     print(open(f"{tmp}/epoch-1/Loss.log").read(), end="")
        ...     print(logger.read_numeric("Loss", 1), logger.read_numeric("Loss", 2))
        0.5
        0.3
        [0.5, 0.3] [0.2]
    """

    def __init__(self, directory: str | os.PathLike[str], epoch: int = 1) -> None:
        self.directory = Path(directory)
        self.epoch = _check_epoch("FileMetricLogger", epoch)
        self._files: dict[str, int] = {}  # metric name -> open descriptor, this epoch
        self._started: set[str] = set()  # metrics whose file of this epoch was started
        self._lock = threading.Lock()

    def path(self, name: str, epoch: int) -> Path:
        """The file of metric ``name`` in epoch ``epoch``."""
        if not name or name in {".", ".."} or any(c in name for c in "/\\\0\n"):
            raise ArgumentError(
                f"FileMetricLogger: metric name {name!r} cannot name a file "
                "(it must be non-empty, without '/', '\\' or newlines)"
            )
        return self.directory / f"epoch-{epoch}" / f"{name}.log"

    def log(self, entry: MetricEntry) -> None:
        line = (_check_line("FileMetricLogger", entry) + "\n").encode("utf-8")
        with self._lock:
            fd = self._files.get(entry.name)
            if fd is None:
                path = self.path(entry.name, self.epoch)
                path.parent.mkdir(parents=True, exist_ok=True)
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
                if entry.name not in self._started:
                    flags |= os.O_TRUNC
                    self._started.add(entry.name)
                fd = self._files[entry.name] = os.open(path, flags, 0o644)
            view = memoryview(line)
            while view:  # a regular file takes it all at once; a short write would go on
                view = view[os.write(fd, view) :]

    def end_epoch(self, epoch: int) -> None:
        _check_epoch("FileMetricLogger", epoch)
        with self._lock:
            self._close()
            self._started.clear()
            self.epoch = epoch + 1

    def read_numeric(self, name: str, epoch: int) -> list[float]:
        path = self.path(name, _check_epoch("FileMetricLogger", epoch))
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ArgumentError(
                f"FileMetricLogger: no values of {name!r} were logged in epoch {epoch} "
                f"({path} does not exist)"
            ) from None
        # A line still being written has no newline yet: it is not a value yet.
        lines = text.split("\n")[:-1]
        return _parse("FileMetricLogger", lines, str(path))

    def close(self) -> None:
        """Closes the open files (the next entries open them again, appending)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._close()


class InMemoryMetricLogger(MetricLogger):
    """Keeps every serialized value in ``values[epoch][name]``; for tests and notebooks.

    Example:
        >>> from ember.train.metric.base import MetricEntry
        >>> logger = InMemoryMetricLogger()
        >>> logger.log(MetricEntry("Accuracy", "epoch 50.00% - batch 50.00%", "50.0"))
        >>> logger.end_epoch(1)
        >>> logger.values, logger.read_numeric("Accuracy", 1)
        ({1: {'Accuracy': ['50.0']}}, [50.0])
    """

    def __init__(self, epoch: int = 1) -> None:
        self.epoch = _check_epoch("InMemoryMetricLogger", epoch)
        self.values: dict[int, dict[str, list[str]]] = {}
        self._lock = threading.Lock()

    def log(self, entry: MetricEntry) -> None:
        line = _check_line("InMemoryMetricLogger", entry)
        with self._lock:
            self.values.setdefault(self.epoch, {}).setdefault(entry.name, []).append(line)

    def end_epoch(self, epoch: int) -> None:
        _check_epoch("InMemoryMetricLogger", epoch)
        with self._lock:
            self.epoch = epoch + 1

    def read_numeric(self, name: str, epoch: int) -> list[float]:
        _check_epoch("InMemoryMetricLogger", epoch)
        with self._lock:
            values = list(self.values.get(epoch, {}).get(name, ()))
        if not values:
            raise ArgumentError(
                f"InMemoryMetricLogger: no values of {name!r} were logged in epoch {epoch}"
            )
        return _parse("InMemoryMetricLogger", values, f"metric {name!r} of epoch {epoch}")


@contextlib.contextmanager
def experiment_log(artifact_dir: str | os.PathLike[str], level: int = logging.INFO,
                   logger: str = "ember") -> Iterator[Path]:  # fmt: skip
    """Sends the records of ``logger`` (ember's, by default) to ``<artifact_dir>/experiment.log``.

    The file is appended to, so a resumed run continues the log of the run it resumes;
    the handler is removed on leaving, errors included.

    Example:
        >>> import logging, tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     with experiment_log(tmp) as path:
        ...         logging.getLogger("ember.train").info("epoch 1 done")
        ...     print(path.name, path.read_text().strip().endswith("epoch 1 done"))
        experiment.log True
    """
    directory = Path(artifact_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "experiment.log"
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(level)
    target = logging.getLogger(logger)
    previous = target.level
    if target.getEffectiveLevel() > level:
        target.setLevel(level)
    target.addHandler(handler)
    try:
        yield path
    finally:
        target.removeHandler(handler)
        target.setLevel(previous)
        handler.close()
