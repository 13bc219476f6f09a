"""Learning-rate schedulers: each sequence against its closed form (written out here) and
against torch.optim.lr_scheduler; saving and resuming through recorders; configs; errors.

Alignment with PyTorch: ember's k-th ``step()`` returns the rate of iteration k - 1, which in
PyTorch is the optimizer's rate after k - 1 calls of ``scheduler.step()``. ``torch_rates``
reads the rate before each ``scheduler.step()``, so both lists are indexed by iteration.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import pytest
import torch
from torch.optim import lr_scheduler as tl

from ember.backend.errors import ArgumentError, ConfigError, RecordMismatchError
from ember.optim.lr_scheduler.base import LrScheduler, LrSchedulerConfig
from ember.optim.lr_scheduler.composed import ComposedLrScheduler, ComposedLrSchedulerConfig
from ember.optim.lr_scheduler.constant import ConstantLr, ConstantLrConfig, as_scheduler
from ember.optim.lr_scheduler.cosine import CosineAnnealingLrSchedulerConfig
from ember.optim.lr_scheduler.exponential import ExponentialLrSchedulerConfig
from ember.optim.lr_scheduler.linear import LinearLrSchedulerConfig
from ember.optim.lr_scheduler.noam import NoamLrSchedulerConfig
from ember.optim.lr_scheduler.sequential import SequentialLrScheduler, SequentialLrSchedulerConfig
from ember.optim.lr_scheduler.step import StepLrSchedulerConfig
from ember.record import BinBytesRecorder, NamedMpkFileRecorder

REL = 1e-10  # PyTorch updates most rates recursively; ember computes them from the count


def rates(scheduler: LrScheduler, n: int) -> list[float]:
    return [scheduler.step() for _ in range(n)]


def torch_rates(make: Callable[[torch.optim.Optimizer], object], base_lr: float, n: int):
    """The optimizer's rate at iterations 0..n-1 under a torch scheduler."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=base_lr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SequentialLR's internal step(0) is deprecated API
        scheduler = make(optimizer)
        out = []
        for _ in range(n):
            out.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
    return out


def assert_rates(actual: list[float], expected: list[float], rel: float = REL) -> None:
    assert len(actual) == len(expected)
    assert actual == pytest.approx(expected, rel=rel, abs=1e-15)


# ------------------------------------------------------------------------ each scheduler


def test_constant_and_as_scheduler():
    assert rates(ConstantLr(0.3), 4) == [0.3] * 4
    scheduler = as_scheduler(2)  # an int is a rate too
    assert isinstance(scheduler, ConstantLr) and rates(scheduler, 2) == [2.0, 2.0]
    assert type(scheduler.step()) is float
    linear = LinearLrSchedulerConfig(0.5, 0.1, 2).init()
    assert as_scheduler(linear) is linear
    assert ConstantLrConfig(0.25).init() == ConstantLr(0.25)
    assert ConstantLr(0.1).to_record() is None


@pytest.mark.parametrize(
    ("initial", "final", "num_iters"),
    [(0.9, 0.5, 4), (0.01, 0.1, 7), (0.2, 0.2, 3)],
    ids=["falling", "warmup", "flat"],
)
def test_linear(initial, final, num_iters):
    n = num_iters + 5
    got = rates(LinearLrSchedulerConfig(initial, final, num_iters).init(), n)
    formula = [initial + (final - initial) * min(i, num_iters) / num_iters for i in range(n)]
    assert_rates(got, formula)
    assert got[0] == initial and got[num_iters:] == [final] * 5  # exact ends
    base = max(initial, final)  # torch's factors must lie in (0, 1]
    reference = torch_rates(
        lambda o: tl.LinearLR(o, initial / base, final / base, total_iters=num_iters), base, n
    )
    assert_rates(got, reference)


def test_linear_matches_burns_sequence():
    got = rates(LinearLrSchedulerConfig(0.9, 0.5, 4).init(), 6)
    assert_rates(got, [0.9, 0.8, 0.7, 0.6, 0.5, 0.5], rel=1e-12)


def test_exponential():
    initial, gamma, n = 0.8, 0.7, 25
    got = rates(ExponentialLrSchedulerConfig(initial, gamma).init(), n)
    assert_rates(got, [initial * gamma**i for i in range(n)])
    assert_rates(got, torch_rates(lambda o: tl.ExponentialLR(o, gamma), initial, n))


@pytest.mark.parametrize(("step_size", "gamma"), [(3, 0.1), (2, 2.0), (1, 0.5)])
def test_step(step_size, gamma):
    initial, n = 0.4, 12
    got = rates(StepLrSchedulerConfig(initial, step_size, gamma=gamma).init(), n)
    assert_rates(got, [initial * gamma ** (i // step_size) for i in range(n)])
    assert_rates(got, torch_rates(lambda o: tl.StepLR(o, step_size, gamma), initial, n))


def test_step_default_gamma_is_burns_and_torchs():
    assert StepLrSchedulerConfig(0.5, 3).gamma == 0.1
    got = rates(StepLrSchedulerConfig(0.5, 3).init(), 9)
    assert_rates(got, torch_rates(lambda o: tl.StepLR(o, 3), 0.5, 9))


@pytest.mark.parametrize("min_lr", [0.0, 0.1])
def test_cosine(min_lr):
    initial, num_iters = 0.5, 10
    n = 3 * (num_iters + 1) + 4  # three full cycles and part of a fourth
    got = rates(CosineAnnealingLrSchedulerConfig(initial, num_iters, min_lr=min_lr).init(), n)

    def formula(i: int) -> float:
        t = i % (num_iters + 1)  # Burn restarts after reaching min_lr
        return min_lr + (initial - min_lr) * (1 + math.cos(math.pi * t / num_iters)) / 2

    assert_rates(got, [formula(i) for i in range(n)])
    assert got[num_iters] == pytest.approx(min_lr, abs=1e-15)
    assert got[num_iters + 1] == initial
    # PyTorch agrees on the first cycle; after it, it follows the cosine back up instead.
    first = num_iters + 1
    reference = torch_rates(lambda o: tl.CosineAnnealingLR(o, num_iters, min_lr), initial, first)
    assert_rates(got[:first], reference)


def test_noam():
    init_lr, warmup, size, n = 2.0, 10, 64, 40
    got = rates(NoamLrSchedulerConfig(init_lr, warmup_steps=warmup, model_size=size).init(), n)

    def factor(i: int) -> float:
        s = i + 1
        return size**-0.5 * min(s**-0.5, s * warmup**-1.5)

    assert_rates(got, [init_lr * factor(i) for i in range(n)])
    assert_rates(got, torch_rates(lambda o: tl.LambdaLR(o, factor), init_lr, n))
    assert max(range(n), key=got.__getitem__) == warmup - 1  # the peak is step `warmup`


def test_noam_defaults():
    config = NoamLrSchedulerConfig(1.0)
    assert (config.warmup_steps, config.model_size) == (4000, 512)
    got = rates(config.init(), 3)
    assert_rates(got, [512**-0.5 * s * 4000**-1.5 for s in (1, 2, 3)])


# ---------------------------------------------------------------------------- compositions


def test_sequential_warmup_then_cosine_matches_torch():
    base, n = 0.1, 3 + 5  # the cosine's first cycle, where torch agrees
    config = SequentialLrSchedulerConfig(
        [
            LinearLrSchedulerConfig(0.01, 0.05, num_iters=3),  # never reaches 0.05: switched
            CosineAnnealingLrSchedulerConfig(base, num_iters=4, min_lr=0.02),
        ],
        milestones=[3],
    )
    got = rates(config.init(), n)
    cosine = [0.02 + (base - 0.02) * (1 + math.cos(math.pi * t / 4)) / 2 for t in range(5)]
    assert_rates(got, [0.01, 0.01 + 0.04 / 3, 0.01 + 0.08 / 3, *cosine])
    reference = torch_rates(
        lambda o: tl.SequentialLR(
            o, [tl.LinearLR(o, 0.1, 0.5, total_iters=3), tl.CosineAnnealingLR(o, 4, 0.02)], [3]
        ),
        base,
        n,
    )
    assert_rates(got, reference)


def test_sequential_three_phases_matches_torch():
    base, n = 0.5, 16
    children = [
        LinearLrSchedulerConfig(0.05, 0.5, num_iters=4),
        ExponentialLrSchedulerConfig(base, 0.8),
        StepLrSchedulerConfig(base, step_size=2, gamma=0.5),
    ]
    got = rates(SequentialLrSchedulerConfig(children, milestones=[4, 9]).init(), n)
    expected = (
        [0.05 + 0.45 * i / 4 for i in range(4)]
        + [base * 0.8**t for t in range(5)]
        + [base * 0.5 ** (t // 2) for t in range(n - 9)]
    )
    assert_rates(got, expected)
    reference = torch_rates(
        lambda o: tl.SequentialLR(
            o,
            [
                tl.LinearLR(o, 0.1, 1.0, total_iters=4),
                tl.ExponentialLR(o, 0.8),
                tl.StepLR(o, 2, 0.5),
            ],
            [4, 9],
        ),
        base,
        n,
    )
    assert_rates(got, reference)


def test_sequential_of_scheduler_objects_and_floats():
    decay = StepLrSchedulerConfig(0.3, step_size=1, gamma=0.5).init()
    scheduler = SequentialLrScheduler([0.7, decay, 0.01], milestones=[2, 4])
    assert_rates(rates(scheduler, 6), [0.7, 0.7, 0.3, 0.15, 0.01, 0.01])


@pytest.mark.parametrize("reduction", ["prod", "sum", "avg"])
def test_composed_reductions(reduction):
    n = 12
    linear = LinearLrSchedulerConfig(0.2, 1.0, num_iters=5)
    exponential = ExponentialLrSchedulerConfig(0.9, 0.75)
    step = StepLrSchedulerConfig(0.6, step_size=4, gamma=0.5)
    config = ComposedLrSchedulerConfig(schedulers=[linear, exponential, step], reduction=reduction)
    got = rates(config.init(), n)
    expected = []
    for i in range(n):
        parts = [0.2 + 0.8 * min(i, 5) / 5, 0.9 * 0.75**i, 0.6 * 0.5 ** (i // 4)]
        combined = {"prod": math.prod(parts), "sum": sum(parts), "avg": sum(parts) / 3}
        expected.append(combined[reduction])
    assert_rates(got, expected)


def test_composed_product_matches_torch_chained():
    # With the optimizer's rate at 1, torch's chained factors are the rates themselves.
    n = 15
    config = ComposedLrSchedulerConfig(
        schedulers=[
            LinearLrSchedulerConfig(0.25, 1.0, num_iters=6),
            ExponentialLrSchedulerConfig(1.0, 0.9),
        ]
    )
    assert config.reduction == "prod"  # Burn's default
    got = rates(config.init(), n)
    reference = torch_rates(
        lambda o: tl.ChainedScheduler(
            [tl.LinearLR(o, 0.25, 1.0, total_iters=6), tl.ExponentialLR(o, 0.9)]
        ),
        1.0,
        n,
    )
    assert_rates(got, reference)


# ------------------------------------------------------------------------- save and resume

SCHEDULES: dict[str, Callable[[], LrScheduler]] = {
    "constant": lambda: ConstantLrConfig(0.2).init(),
    "linear": lambda: LinearLrSchedulerConfig(0.9, 0.1, 8).init(),
    "exponential": lambda: ExponentialLrSchedulerConfig(0.7, 0.9).init(),
    "step": lambda: StepLrSchedulerConfig(0.5, 3).init(),
    "cosine": lambda: CosineAnnealingLrSchedulerConfig(0.5, 4, min_lr=0.05).init(),
    "noam": lambda: NoamLrSchedulerConfig(1.0, warmup_steps=5, model_size=32).init(),
    "sequential": lambda: SequentialLrSchedulerConfig(
        [
            LinearLrSchedulerConfig(0.1, 0.5, 3),
            ComposedLrSchedulerConfig(
                schedulers=[CosineAnnealingLrSchedulerConfig(0.5, 6), ConstantLrConfig(0.5)]
            ),
            ExponentialLrSchedulerConfig(0.3, 0.5),
        ],
        milestones=[3, 7],
    ).init(),
    "composed": lambda: ComposedLrScheduler(
        [
            NoamLrSchedulerConfig(4.0, warmup_steps=3, model_size=16).init(),
            0.5,
            StepLrSchedulerConfig(1.0, 2, gamma=0.5).init(),
        ],
        reduction="sum",
    ),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("recorder", ["named_mpk_file", "bin_bytes"])
def test_resume_continues_identically(name, recorder, tmp_path):
    make = SCHEDULES[name]
    uninterrupted = rates(make(), 14)
    scheduler = make()
    assert rates(scheduler, 5) == uninterrupted[:5]
    record = scheduler.to_record()
    if recorder == "named_mpk_file":
        path = NamedMpkFileRecorder().save(record, tmp_path / "scheduler")
        loaded = NamedMpkFileRecorder().load(path)
    else:
        loaded = BinBytesRecorder().from_bytes(BinBytesRecorder().to_bytes(record))
    assert loaded == record

    resumed = make().load_record(loaded)
    assert rates(resumed, 9) == uninterrupted[5:]  # exactly the same floats
    assert rates(scheduler, 9) == uninterrupted[5:]  # the saved one was left as it was


def test_load_record_returns_a_new_scheduler():
    scheduler = ExponentialLrSchedulerConfig(0.5, 0.5).init()
    resumed = scheduler.load_record(3)
    assert resumed is not scheduler
    assert scheduler.step() == 0.5 and resumed.step() == 0.5 * 0.5**3


def test_records_are_plain_data():
    scheduler = SCHEDULES["sequential"]()
    rates(scheduler, 5)
    assert scheduler.to_record() == {
        "iteration": 5,
        "schedulers": [3, {"schedulers": [2, None]}, 0],
    }


# ------------------------------------------------------------------------------ configs


def test_configs_round_trip_through_json():
    config = SequentialLrSchedulerConfig(
        [
            NoamLrSchedulerConfig(2.0, warmup_steps=3),
            ComposedLrSchedulerConfig(
                schedulers=[StepLrSchedulerConfig(0.5, 2), ConstantLrConfig(0.1)],
                reduction="avg",
            ),
        ],
        milestones=[5],
    )
    text = config.to_json()
    assert '"ComposedLrSchedulerConfig"' in text and '"NoamLrSchedulerConfig"' in text
    loaded = SequentialLrSchedulerConfig.load_json(text)
    assert loaded == config
    assert rates(loaded.init(), 9) == rates(config.init(), 9)


def test_builders_and_defaults():
    config = CosineAnnealingLrSchedulerConfig(0.5, 10)
    assert config.min_lr == 0.0
    assert config.with_min_lr(0.1).min_lr == 0.1
    assert ComposedLrSchedulerConfig().schedulers == ()
    assert isinstance(LinearLrSchedulerConfig(0.5, 0.1, 2), LrSchedulerConfig)


# -------------------------------------------------------------------------------- errors

CONFIG_ERRORS = {
    "linear initial_lr 0": (
        lambda: LinearLrSchedulerConfig(0.0, 0.5, 3),
        "LinearLrSchedulerConfig.initial_lr", "expected greater than 0, got 0.0",
    ),
    "linear initial_lr > 1": (
        lambda: LinearLrSchedulerConfig(1.5, 0.5, 3),
        "LinearLrSchedulerConfig.initial_lr", "expected less than or equal to 1, got 1.5",
    ),
    "linear final_lr < 0": (
        lambda: LinearLrSchedulerConfig(0.5, -0.1, 3),
        "LinearLrSchedulerConfig.final_lr", "expected greater than or equal to 0, got -0.1",
    ),
    "linear num_iters 0": (
        lambda: LinearLrSchedulerConfig(0.5, 0.1, 0),
        "LinearLrSchedulerConfig.num_iters", "expected greater than or equal to 1, got 0",
    ),
    "exponential initial_lr": (
        lambda: ExponentialLrSchedulerConfig(-0.1, 0.5),
        "ExponentialLrSchedulerConfig.initial_lr", "expected greater than 0, got -0.1",
    ),
    "exponential gamma 0": (
        lambda: ExponentialLrSchedulerConfig(0.5, 0.0),
        "ExponentialLrSchedulerConfig.gamma", "expected greater than 0, got 0.0",
    ),
    "exponential gamma > 1": (
        lambda: ExponentialLrSchedulerConfig(0.5, 1.5),
        "ExponentialLrSchedulerConfig.gamma", "expected less than or equal to 1, got 1.5",
    ),
    "step step_size 0": (
        lambda: StepLrSchedulerConfig(0.5, 0),
        "StepLrSchedulerConfig.step_size", "expected greater than or equal to 1, got 0",
    ),
    "step gamma nan": (
        lambda: StepLrSchedulerConfig(0.5, 2, gamma=float("nan")),
        "StepLrSchedulerConfig.gamma", "expected a finite number, got nan",
    ),
    "cosine initial_lr": (
        lambda: CosineAnnealingLrSchedulerConfig(2.0, 5),
        "CosineAnnealingLrSchedulerConfig.initial_lr", "expected less than or equal to 1, got 2.0",
    ),
    "cosine num_iters 0": (
        lambda: CosineAnnealingLrSchedulerConfig(0.5, 0),
        "CosineAnnealingLrSchedulerConfig.num_iters", "expected greater than or equal to 1, got 0",
    ),
    "cosine min_lr < 0": (
        lambda: CosineAnnealingLrSchedulerConfig(0.5, 5, min_lr=-0.1),
        "CosineAnnealingLrSchedulerConfig.min_lr", "expected greater than or equal to 0, got -0.1",
    ),
    "cosine min_lr > initial_lr": (
        lambda: CosineAnnealingLrSchedulerConfig(0.5, 5, min_lr=0.6).init(),
        "CosineAnnealingLrSchedulerConfig.min_lr", "expected at most initial_lr (0.5), got 0.6",
    ),
    "noam warmup_steps 0": (
        lambda: NoamLrSchedulerConfig(1.0, warmup_steps=0),
        "NoamLrSchedulerConfig.warmup_steps", "expected greater than or equal to 1, got 0",
    ),
    "noam model_size 0": (
        lambda: NoamLrSchedulerConfig(1.0, model_size=0),
        "NoamLrSchedulerConfig.model_size", "expected greater than or equal to 1, got 0",
    ),
    "sequential too many milestones": (
        lambda: SequentialLrSchedulerConfig(
            [ConstantLrConfig(0.1), ConstantLrConfig(0.2)], milestones=[2, 4]
        ).init(),
        "SequentialLrSchedulerConfig.milestones",
        "expected 1 milestone(s), one fewer than the 2 scheduler(s), got 2: [2, 4]",
    ),
    "sequential unordered milestones": (
        lambda: SequentialLrSchedulerConfig(
            [ConstantLrConfig(0.1), ConstantLrConfig(0.2), ConstantLrConfig(0.3)],
            milestones=[4, 2],
        ).init(),
        "SequentialLrSchedulerConfig.milestones", "expected strictly increasing iterations",
    ),
    "sequential milestone 0": (
        lambda: SequentialLrSchedulerConfig(
            [ConstantLrConfig(0.1), ConstantLrConfig(0.2)], milestones=[0]
        ),
        "SequentialLrSchedulerConfig.milestones[0]", "expected greater than or equal to 1, got 0",
    ),
    "sequential bad child": (
        lambda: SequentialLrSchedulerConfig(
            [ConstantLrConfig(0.1), CosineAnnealingLrSchedulerConfig(0.5, 5, min_lr=0.6)],
            milestones=[2],
        ).init(),
        "SequentialLrSchedulerConfig.schedulers[1].min_lr",
        "CosineAnnealingLrSchedulerConfig.min_lr: expected at most initial_lr",
    ),
    "composed empty": (
        lambda: ComposedLrSchedulerConfig().init(),
        "ComposedLrSchedulerConfig.schedulers", "expected at least one scheduler config",
    ),
    "composed reduction": (
        lambda: ComposedLrSchedulerConfig(schedulers=[ConstantLrConfig(0.1)], reduction="max"),
        "ComposedLrSchedulerConfig.reduction", "expected 'prod', 'sum' or 'avg', got 'max'",
    ),
    "composed child not a config": (
        lambda: ComposedLrSchedulerConfig(schedulers=[0.1]),
        "ComposedLrSchedulerConfig.schedulers[0]", "expected one of the LrSchedulerConfig",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CONFIG_ERRORS))
def test_config_errors(case):
    build, field, message = CONFIG_ERRORS[case]
    with pytest.raises(ConfigError) as info:
        build()
    assert field in info.value.fields
    assert str(info.value).startswith(field.split("[")[0])
    assert message in str(info.value)


ARGUMENT_ERRORS = {
    "as_scheduler str": (lambda: as_scheduler("0.1"), "got str '0.1'"),
    "as_scheduler bool": (lambda: as_scheduler(True), "got bool True"),
    "as_scheduler config": (
        lambda: as_scheduler(ConstantLrConfig(0.1)),
        "expected a learning rate scheduler (an LrScheduler) or a constant learning rate",
    ),
    "as_scheduler inf": (lambda: as_scheduler(math.inf), "must be finite, got inf"),
    "constant nan": (lambda: ConstantLr(math.nan), "ConstantLr: lr must be a finite number"),
    "sequential milestones": (
        lambda: SequentialLrScheduler([0.1, 0.2], milestones=[]),
        "SequentialLrScheduler: milestones: expected 1 milestone(s)",
    ),
    "sequential child": (
        lambda: SequentialLrScheduler([0.1, "fast"], milestones=[2]),
        "got str 'fast'",
    ),
    "sequential empty": (
        lambda: SequentialLrScheduler([], milestones=[]),
        "SequentialLrScheduler: expected at least one scheduler",
    ),
    "composed reduction": (
        lambda: ComposedLrScheduler([0.1], reduction="max"),
        "ComposedLrScheduler: reduction must be one of ['prod', 'sum', 'avg'], got 'max'",
    ),
    "composed not a list": (
        lambda: ComposedLrScheduler(0.1),
        "ComposedLrScheduler: schedulers must be a list of schedulers, got 0.1",
    ),
    "negative iteration": (
        lambda: type(LinearLrSchedulerConfig(0.5, 0.1, 2).init())(
            LinearLrSchedulerConfig(0.5, 0.1, 2), iteration=-1
        ),
        "LinearLrScheduler: iteration must be an integer >= 0",
    ),
}


@pytest.mark.parametrize("case", list(ARGUMENT_ERRORS))
def test_argument_errors(case):
    build, message = ARGUMENT_ERRORS[case]
    with pytest.raises(ArgumentError) as info:
        build()
    assert message in str(info.value)


RECORD_ERRORS = {
    "count not int": ("linear", "3", "LinearLrScheduler: expected a record holding", None),
    "count negative": ("step", -1, "(an integer >= 0), got -1", None),
    "count bool": ("noam", True, "got True", None),
    "constant": ("constant", 0, "ConstantLr: has no state, so its record is None, got 0", None),
    "sequential keys": (
        "sequential", {"iteration": 1}, "missing ['schedulers']", "schedulers",
    ),
    "sequential iteration": (
        "sequential", {"iteration": -2, "schedulers": [0, {"schedulers": [0, None]}, 0]},
        "expected 'iteration' to be the number of steps taken", "iteration",
    ),
    "sequential child count": (
        "sequential", {"iteration": 1, "schedulers": [0, 0]},
        "expected a list of 3 scheduler records", "schedulers",
    ),
    "nested child": (
        "sequential", {"iteration": 1, "schedulers": [0, {"schedulers": [0, 5]}, 0]},
        "SequentialLrScheduler.schedulers[1]: ComposedLrScheduler.schedulers[1]: ConstantLr",
        "schedulers.1.schedulers.1",
    ),
    "composed not a dict": ("composed", [0, None, 0], "expected a record dict", None),
}  # fmt: skip


@pytest.mark.parametrize("case", list(RECORD_ERRORS))
def test_record_errors(case):
    name, record, message, path = RECORD_ERRORS[case]
    with pytest.raises(RecordMismatchError) as info:
        SCHEDULES[name]().load_record(record)
    assert message in str(info.value)
    assert info.value.path == path


def test_family_root_cannot_be_built():
    with pytest.raises(ConfigError, match="LrSchedulerConfig is a family of configs"):
        LrSchedulerConfig()
