"""DataLoader process workers: same batches as threads, shared memory, shutdown, crashes.

Every test checks on the way out that no worker process is left and that the segment
folders of this process are gone (the ``no_leaks`` fixture). Datasets and batchers are
module-level classes so that the spawn start method can pickle them.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import glob
import mmap
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ember
from ember import Tensor
from ember.backend.errors import ArgumentError
from ember.data.dataloader import Batcher, DataLoaderBuilder, DataLoaderWorkerError
from ember.data.dataloader.shared_batch import SegmentFolder, pack, unpack

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the checks read /proc and /dev/shm (Linux)"
)

SRC = Path(__file__).resolve().parents[2] / "src"


def segment_folders(pid: int | None = None) -> list[str]:
    pid = os.getpid() if pid is None else pid
    bases = {"/dev/shm", tempfile.gettempdir()}
    return [p for base in bases for p in glob.glob(f"{base}/ember-loader-{pid}-*")]


def worker_children() -> list[multiprocessing.process.BaseProcess]:
    return [p for p in multiprocessing.active_children() if p.name.startswith("ember-data-")]


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture(autouse=True)
def no_leaks():
    yield
    if worker_children() or segment_folders():
        # Loaders dropped by the test shut their workers down when collected (a collection
        # walks the whole heap: a second late in a long pytest run, so only when needed).
        gc.collect()
    assert worker_children() == []
    assert segment_folders() == []


def bounded(fn, seconds: float = 20.0):
    """``fn()``'s result or exception, failing the test if it has not returned in ``seconds``."""
    outcome = {}

    def run():
        try:
            outcome["value"] = fn()
        except BaseException as error:  # handed to the test below
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"hung for more than {seconds} s"
    outcome["seconds"] = time.monotonic() - start
    return outcome


# ---------------------------------------------------------------------------- datasets
class Numbers:
    """Items 0..n-1; item ``i`` is a small record with an image-like array."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        image = np.arange(6, dtype=np.float32).reshape(2, 3) + index
        return {"index": index, "image": image, "label": index % 3}


@dataclasses.dataclass
class Batch:
    images: Tensor
    labels: Tensor
    mask: Tensor
    meta: dict


class Records(Batcher[dict, tuple]):
    """A nested batch: a dataclass of tensors of three kinds, a tuple, a list, plain values."""

    def batch(self, items, device):
        time.sleep(0.001 * (items[0]["index"] % 3))  # workers finish out of order
        images = Tensor.from_data(np.stack([item["image"] for item in items]), device=device)
        labels = Tensor.from_data(np.array([item["label"] for item in items]), device=device)
        mask = Tensor.from_data(np.array([item["index"] % 2 == 0 for item in items]), device)
        indices = [item["index"] for item in items]
        meta = {"indices": indices, "first": (indices[0], "text"), "none": None}
        return Batch(images, labels, mask, meta), [np.array(indices)[::2], 7.5]


def as_plain(batch) -> tuple:
    """The batch with tensors as (dtype, kind, list) so that batches compare with ==."""
    record, (evens, scalar) = batch
    tensors = [record.images, record.labels, record.mask]
    return (
        [(t.dtype, t.kind, t.tolist()) for t in tensors],
        record.meta,
        evens.tolist(),
        scalar,
    )


def build(n=37, batch_size=4, seed=11, workers=0, kind="thread", device=None, batcher=None,
          dataset=None, **options):  # fmt: skip
    builder = DataLoaderBuilder(batcher or Records()).batch_size(batch_size)
    if seed is not None:
        builder = builder.shuffle(seed)
    if device is not None:
        builder = builder.set_device(device)
    builder = builder.num_workers(workers, kind, **options)
    return builder.build(dataset if dataset is not None else Numbers(n))


# ---------------------------------------------------------------------------- same batches
@pytest.mark.parametrize("persistent", [False, True])
def test_processes_threads_and_no_worker_give_the_same_batches(persistent):
    serial = build()
    threads = build(workers=2)
    processes = build(workers=3, kind="process", persistent=persistent)
    with processes:
        for epoch in (0, 3):
            for loader in (serial, threads, processes):
                loader.set_epoch(epoch)
            want = [as_plain(b) for b in serial]
            assert [as_plain(b) for b in threads] == want
            assert [as_plain(b) for b in processes] == want
            assert sorted(i for b in want for i in b[1]["indices"]) == list(range(37))
        assert want != [as_plain(b) for b in build(seed=None)]  # the seed is at work


def test_split_parts_from_processes_match_the_unsplit_order():
    serial = build(n=29, batch_size=3)
    processes = build(n=29, batch_size=3, workers=2, kind="process", persistent=True)
    for loader in (serial, processes):
        loader.set_epoch(2)
    parts, serial_parts = processes.split(2), serial.split(2)
    for epoch in (2, 5):
        for part in (*parts, *serial_parts):
            part.set_epoch(epoch)
        serial.set_epoch(epoch)
        assert [as_plain(b) for b in parts[1]] == [as_plain(b) for b in serial_parts[1]]
        both = [i for part in parts for b in part for i in as_plain(b)[1]["indices"]]
        assert both == [i for b in serial for i in as_plain(b)[1]["indices"]]
    for part in parts:
        part.close()
    processes.close()


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_spawned_workers_give_the_same_batches_and_stay_while_idle(start_method):
    want = [as_plain(b) for b in build(n=10)]
    loader = build(n=10, workers=1, kind="process", start_method=start_method, persistent=True)
    with loader:
        assert bounded(lambda: [as_plain(b) for b in loader], seconds=60)["value"] == want
        pid = loader._pool.workers[0].process.pid
        time.sleep(1.2)  # idle workers look for their loader process every half second
        assert [as_plain(b) for b in loader] == want
        assert loader._pool.workers[0].process.pid == pid


# ---------------------------------------------------------------------------- the tensors
def test_tensors_wrap_shared_memory_without_a_copy_on_ndarray():
    device = ember.device("ndarray")
    with build(n=8, workers=2, kind="process", device=device) as loader:
        record, (evens, _) = next(iter(loader))
    array = record.images.into_primitive()
    assert record.images.device == device
    assert not array.flags.writeable  # tensors never change
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, mmap.mmap)  # a view of the segment, not a copy
    assert isinstance(evens, np.ndarray) and evens.flags.writeable
    # The segment's file went at once, the folder with the loader; the mapping stays,
    # valid, while a view of it lives, and goes with the last one.
    assert segment_folders() == [] and mapped_segments() == 1
    gc.collect()
    want = (
        np.arange(6, dtype=np.float32).reshape(2, 3)
        + np.array(record.meta["indices"])[:, None, None]
    )
    np.testing.assert_array_equal(record.images.to_numpy(), want)
    del record, evens, array, base
    gc.collect()
    assert mapped_segments() == 0


def mapped_segments() -> int:
    """How many shared segments of this process's loaders are mapped in it."""
    with open("/proc/self/maps") as maps:
        return sum(f"/ember-loader-{os.getpid()}-" in line for line in maps)


@pytest.mark.parametrize("name", ["autodiff", "torch"])
def test_batches_move_to_the_loader_device(name):
    device = ember.device("ndarray").autodiff() if name == "autodiff" else ember.device("torch")
    want = [as_plain(b) for b in build(n=9, device=device)]
    with build(n=9, workers=2, kind="process", device=device) as loader:
        batches = list(loader)
    assert all(b[0].images.device == device and b[0].mask.device == device for b in batches)
    assert [as_plain(b) for b in batches] == want


def test_arrays_travel_in_the_segment_and_only_a_small_skeleton_is_pickled():
    device = ember.device("ndarray")
    images = Tensor.from_data(np.random.default_rng(0).random((256, 1024), np.float32), device)
    batch = {"images": images, "ids": list(range(256)), "raw": np.arange(1000)}
    folder = SegmentFolder.create()
    try:
        shared = pack(batch, folder, "0-1")
        assert len(pickle.dumps(shared)) < 4096  # what goes through the pipe: 1 MB stays out
        assert os.path.getsize(folder.file("0-1")) == shared.size >= 1024 * 1024 + 8000
        back = unpack(shared, folder, device, device)
        assert os.listdir(folder.path) == []  # unlinked as soon as it is mapped
    finally:
        folder.remove()
    np.testing.assert_array_equal(back["images"].to_numpy(), images.to_numpy())
    np.testing.assert_array_equal(back["raw"], np.arange(1000))
    assert back["ids"] == list(range(256))


class Shapes(Batcher[dict, dict]):
    """Tensors of every kind and odd shapes, and arrays that are not contiguous."""

    def batch(self, items, device):
        items = [item["index"] for item in items]
        n = len(items)
        return {
            "f64": Tensor.from_data(np.linspace(0, 1, 3 * n).reshape(3, n), device=device),
            "scalar": Tensor.from_data(np.float32(items[0]), device=device),
            "empty": Tensor.from_data(np.zeros((0, 4), np.int32), device=device),
            "transposed": Tensor.from_data(np.arange(2 * n).reshape(2, n).T, device=device),
            "strided": np.arange(10 * n, dtype=np.int16)[::3],
            "objects": np.array([{"a": i} for i in items], dtype=object),
        }


def test_every_dtype_and_shape_round_trips():
    for got, want in zip(build(n=7, batcher=Shapes(), workers=2, kind="process"),
                         build(n=7, batcher=Shapes()), strict=True):  # fmt: skip
        for key in ("f64", "scalar", "empty", "transposed"):
            assert (got[key].dtype, got[key].shape) == (want[key].dtype, want[key].shape)
            np.testing.assert_array_equal(got[key].to_numpy(), want[key].to_numpy())
        np.testing.assert_array_equal(got["strided"], want["strided"])
        assert got["objects"].tolist() == want["objects"].tolist()


class Huge(Batcher[dict, Tensor]):
    def batch(self, items, device):
        first = items[0]["index"]
        return Tensor.from_data(np.full((len(items), 4_000_000), first, np.float32), device)


def test_a_huge_batch_comes_back_whole():
    with build(n=6, batch_size=3, seed=None, batcher=Huge(), workers=2, kind="process") as data:
        sums = [float(b.to_numpy().astype(np.float64).sum()) for b in data]  # 48 MB each
    assert sums == [0.0 * 3 * 4e6, 3 * 3 * 4e6]


def test_an_empty_dataset_gives_no_batch_and_starts_no_worker():
    loader = build(n=0, workers=2, kind="process", persistent=True)
    assert list(loader) == [] and len(loader) == 0
    assert loader._pool is None


def test_more_workers_than_batches():
    want = [as_plain(b) for b in build(n=5, batch_size=2)]
    with build(n=5, batch_size=2, workers=8, kind="process", persistent=True) as loader:
        assert [as_plain(b) for b in loader] == want
        assert len(loader._pool.workers) == 3  # one per batch; more would idle


# ---------------------------------------------------------------------------- lifetime
def test_persistent_workers_live_across_epochs_and_close_stops_them():
    loader = build(n=12, workers=2, kind="process", persistent=True)
    list(loader)
    pids = [w.process.pid for w in loader._pool.workers]
    loader.set_epoch(1)
    list(loader)
    assert [w.process.pid for w in loader._pool.workers] == pids
    assert len(worker_children()) == 2 and len(segment_folders()) == 1
    loader.close()
    assert all(gone(pid) for pid in pids)
    assert worker_children() == [] and segment_folders() == []
    assert len(list(loader)) == 3  # a closed loader starts new workers when iterated again
    loader.close()


def test_workers_that_are_not_persistent_end_with_the_epoch():
    loader = build(n=12, workers=2, kind="process")
    batches = iter(loader)
    next(batches)
    assert len(worker_children()) == 2
    list(batches)
    assert worker_children() == [] and segment_folders() == []


def test_a_dropped_loader_stops_its_workers():
    loader = build(n=12, workers=2, kind="process", persistent=True)
    list(loader)
    pids = [w.process.pid for w in loader._pool.workers]
    del loader
    gc.collect()
    assert all(gone(pid) for pid in pids)


def test_leaving_an_epoch_early_frees_its_batches_and_the_next_epoch_is_whole():
    want = [as_plain(b) for b in build(n=40, batch_size=2)]
    with build(n=40, batch_size=2, workers=2, kind="process", persistent=True) as loader:
        for batch in loader:
            assert as_plain(batch) == want[0]
            break
        pids = [w.process.pid for w in loader._pool.workers]
        assert [as_plain(b) for b in loader] == want
        assert [w.process.pid for w in loader._pool.workers] == pids  # the same workers
        assert os.listdir(segment_folders()[0]) == []  # the abandoned batches were freed


def test_a_newer_iteration_or_close_stops_an_older_one_over_persistent_workers():
    want = [as_plain(b) for b in build(n=20, batch_size=2)]
    with build(n=20, batch_size=2, workers=2, kind="process", persistent=True) as loader:
        older = iter(loader)
        assert as_plain(next(older)) == want[0]
        newer = iter(loader)
        assert as_plain(next(newer)) == want[0]
        with pytest.raises(DataLoaderWorkerError, match="superseded by a newer one"):
            next(older)
        assert [as_plain(b) for b in newer] == want[1:]  # the newer one lost nothing
        batches = iter(loader)
        next(batches)
        loader.close()
        with pytest.raises(DataLoaderWorkerError, match="its workers were closed"):
            next(batches)


def test_a_persistent_worker_that_died_between_epochs_is_reported_then_replaced():
    with build(n=12, workers=2, kind="process", persistent=True) as loader:
        list(loader)
        victim = loader._pool.workers[0].process
        pid = victim.pid
        os.kill(pid, signal.SIGKILL)
        victim.join(10)
        with pytest.raises(DataLoaderWorkerError) as error:
            list(loader)
        assert f"worker 0 (pid {pid}) was killed by signal SIGKILL between batches" in str(
            error.value
        )
        assert (error.value.batch, error.value.indices) == (None, ())
        assert len(list(loader)) == 3  # the next epoch starts new workers


LOADER_SCRIPT = """
import os, signal, sys, time
sys.path.insert(0, {tests!r})
from test_process_workers import build
loader = build(n=40, batch_size=2, workers=2, kind="process", persistent=True)
batches = iter(loader)
next(batches)
print(" ".join(str(w.process.pid) for w in loader._pool.workers), loader._pool.folder.path,
      flush=True)
{ending}
"""


@pytest.mark.parametrize(
    "ending",
    ["sys.exit(0)  # no close(): interpreter exit", "os.kill(os.getpid(), signal.SIGKILL)"],
)
def test_no_worker_or_segment_outlives_the_loader_process(ending):
    script = LOADER_SCRIPT.format(tests=str(Path(__file__).parent), ending=ending)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    *pids, folder = run.stdout.split()
    assert len(pids) == 2, run.stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (all(gone(int(p)) for p in pids)
                                               and not os.path.exists(folder)):  # fmt: skip
        time.sleep(0.1)
    assert all(gone(int(p)) for p in pids)
    assert not os.path.exists(folder)


# ---------------------------------------------------------------------------- failures
class Hostile(Numbers):
    """An item that misbehaves in one of several ways; the other items are fine."""

    def __init__(self, n: int, bad: int, how: str):
        super().__init__(n)
        self.bad, self.how = bad, how

    def __getitem__(self, index: int) -> dict:
        if index == self.bad:
            if self.how == "raise":
                raise ValueError(f"item {index} is broken")
            if self.how == "exit":
                os._exit(3)
            if self.how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.how == "segfault":
                ctypes.string_at(0)
            if self.how == "hang":
                time.sleep(60)
        return super().__getitem__(index)


@pytest.mark.parametrize(
    ("how", "text"),
    [
        ("raise", "dataset[13] raised: ValueError: item 13 is broken"),
        ("exit", "exited with code 3 while making batch"),
        ("sigkill", "was killed by signal SIGKILL while making batch"),
        ("segfault", "was killed by signal SIGSEGV while making batch"),
    ],
)
def test_a_failing_worker_raises_a_typed_error_naming_worker_and_items(how, text):
    loader = build(dataset=Hostile(40, bad=13, how=how), seed=None, workers=2, kind="process",
                   persistent=True)  # fmt: skip
    outcome = bounded(lambda: list(loader))
    error = outcome["error"]
    assert isinstance(error, DataLoaderWorkerError) and isinstance(error, ember.EmberError)
    assert text in str(error)
    # items 12..15 make batch 3, which worker 3 % 2 = 1 makes
    assert (error.worker, error.batch, error.indices) == (1, 3, (12, 13, 14, 15))
    assert "worker 1 (pid" in str(error) and "items [12, 13, 14, 15]" in str(error)
    assert error.item == (13 if how == "raise" else None)
    if how == "raise":
        assert "item 13 is broken" in error.cause and "Traceback" in str(error)
    assert loader._pool is None or loader._pool.closed  # the failed pool was shut down
    loader.set_epoch(1)
    assert len(list(build(n=8, workers=2, kind="process"))) == 2  # later loaders still work


@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_killed_from_outside_is_reported_at_once(workers):
    with build(n=40, batch_size=2, workers=workers, kind="process", persistent=True) as loader:
        batches = iter(loader)
        next(batches)
        victim = loader._pool.workers[-1].process.pid
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not gone(victim) and time.monotonic() < deadline:
            time.sleep(0.01)  # one worker: dead before the loader sends it its next task
        outcome = bounded(lambda: list(batches))
    assert isinstance(outcome["error"], DataLoaderWorkerError)
    number = workers - 1
    assert f"worker {number} (pid {victim}) was killed by signal SIGKILL" in str(outcome["error"])


class Failing(Records):
    def batch(self, items, device):
        if any(item["index"] == 5 for item in items):
            raise KeyError("no label for 5")
        return super().batch(items, device)


class Unpicklable(Records):
    def batch(self, items, device):
        return super().batch(items, device), threading.Lock()


@pytest.mark.parametrize(
    ("batcher", "text", "cause"),
    [
        (Failing(), "the batcher raised: KeyError: 'no label for 5'", "KeyError"),
        (Unpicklable(), "the batch could not be sent back", "TypeError: cannot pickle"),
    ],
)
def test_a_failing_batcher_names_the_batch(batcher, text, cause):
    loader = build(n=12, seed=None, batcher=batcher, workers=2, kind="process")
    error = bounded(lambda: list(loader))["error"]
    assert isinstance(error, DataLoaderWorkerError)
    assert text in str(error) and error.cause.startswith(cause)
    assert error.indices == (4, 5, 6, 7) if isinstance(batcher, Failing) else (0, 1, 2, 3)
    assert error.item is None


def test_a_stuck_worker_is_bounded_by_the_timeout():
    loader = build(dataset=Hostile(12, bad=5, how="hang"), seed=None, workers=2,
                   kind="process", timeout=0.5)  # fmt: skip
    outcome = bounded(lambda: list(loader))
    assert isinstance(outcome["error"], DataLoaderWorkerError)
    assert "did not deliver batch 1 (items [4, 5, 6, 7]) within 0.5 s" in str(outcome["error"])


def test_an_unpicklable_dataset_under_spawn_is_a_typed_error():
    dataset = Numbers(4)
    dataset.lock = threading.Lock()
    error = bounded(lambda: list(build(dataset=dataset, workers=1, kind="process",
                                       start_method="spawn")))["error"]  # fmt: skip
    assert isinstance(error, DataLoaderWorkerError)
    assert "could not start with start method 'spawn'" in str(error)


def test_the_error_pickles_with_what_it_carries():
    error = DataLoaderWorkerError("boom", worker=2, pid=99, batch=4, indices=[8, 9], item=9,
                                  cause="ValueError: x")  # fmt: skip
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.worker, copy.pid, copy.batch, copy.indices, copy.item, copy.cause) == (
        "boom",
        2,
        99,
        4,
        (8, 9),
        9,
        "ValueError: x",
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kind": "gpu"}, "kind must be 'thread' or 'process', got 'gpu'"),
        ({"kind": "thread", "persistent": True}, "apply to process workers"),
        ({"kind": "process", "start_method": "clone"}, "start_method must be one of fork"),
        ({"kind": "process", "timeout": 0}, "timeout must be a number > 0 or None, got 0"),
        ({"kind": "process", "persistent": 1}, "persistent must be a bool, got 1"),
    ],
)
def test_bad_worker_settings_raise_argument_errors(options, message):
    with pytest.raises(ArgumentError) as error:
        DataLoaderBuilder(Records()).num_workers(2, **options)
    assert message in str(error.value)
