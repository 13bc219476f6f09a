"""The ``ember`` command.

Commands::

    ember guide train        train the guide's model on MNIST (the dashboard on a terminal)
    ember guide infer        classify test digits with the trained model
    ember guide custom-loop  train the same model with a hand-written loop
    ember launch --nproc N script.py ...
                             run a script in N processes that form one job (torchrun)
    ember bench              run the benchmark suite; ember bench compare A.json B.json
    ember report ARTIFACT_DIR
                             write the training report (charts and index.html) of a run

``ember guide <command> --help`` lists each command's options. ``python -m ember`` is
the same command. Errors (no trained model, an unknown backend, missing data) print
one message on standard error and exit with status 1; bad options exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ember.backend.device import Device, device
from ember.backend.errors import EmberError

if TYPE_CHECKING:
    from ember.guide.training import TrainingConfig
    from ember.train.renderer.base import MetricsRenderer
    from ember.train.tracker.base import ExperimentTracker

DEFAULT_ARTIFACT_DIR = "/tmp/guide"


def _at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _add_device_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=("ndarray", "torch"),
        default="ndarray",
        help="the backend to run on (default: ndarray, NumPy)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        metavar="SPEC",
        help="the device of the backend: cpu, cuda:0, ... (default: cpu)",
    )
    parser.add_argument(
        "--fusion",
        action="store_true",
        help="record ops lazily and run element-wise chains as fused compiled kernels "
        "(the Fusion decorator; needs numba, ember[jit]; EMBER_FUSION_RUNTIME=interpreter "
        "runs them without compiling)",
    )


def _add_training_options(parser: argparse.ArgumentParser) -> None:
    """The options of a training run; None leaves the TrainingConfig default."""
    parser.add_argument(
        "--epochs",
        type=_at_least(1),
        metavar="N",
        help="passes over the training set (default: 10)",
    )
    parser.add_argument(
        "--batch-size", type=_at_least(1), metavar="N", help="digits per batch (default: 64)"
    )
    parser.add_argument(
        "--num-workers",
        type=_at_least(0),
        metavar="N",
        help="threads preparing batches (default: 0, or 1 on CUDA)",
    )
    parser.add_argument(
        "--seed",
        type=_at_least(0),
        metavar="N",
        help="seeds the weights, dropout and shuffling (default: 42)",
    )
    parser.add_argument(
        "--lr", type=_positive_float, metavar="X", help="the learning rate (default: 1e-4)"
    )
    _add_device_options(parser)


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``ember`` command and its subcommands."""
    parser = argparse.ArgumentParser(
        prog="ember", description="ember: deep learning on the design of Burn."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    guide = commands.add_parser(
        "guide",
        help="the Burn book's guide: a CNN on MNIST",
        description="The guide's workflow: train a CNN on MNIST, then use it for inference.",
    )
    steps = guide.add_subparsers(dest="step", required=True, metavar="STEP")
    # ``ember onnx ...`` is parsed by ember.onnx.cli (see main); listed here for --help.
    commands.add_parser("onnx", help="import ONNX models as ember code plus weights; export "
                        "the guide's model to ONNX",
                        add_help=False)  # fmt: skip
    # ``ember launch ...`` is parsed by ember.distributed.launch (see main).
    commands.add_parser("launch", help="run a script in several processes (a distributed job)",
                        add_help=False)  # fmt: skip
    # ``ember bench ...`` is parsed by ember.bench.cli (see main).
    commands.add_parser("bench", help="run the benchmark suite, print ratios to PyTorch, save "
                        "and compare runs", add_help=False)  # fmt: skip

    report = commands.add_parser(
        "report",
        help="write the training report (PNG charts, index.html) of a run's artifact folder",
        description="Writes the training report of a fit's artifact folder: a PNG chart "
        "per numeric metric (train and valid by epoch, and per step where logged) and a "
        "self-contained index.html with the summary table and the run's config. Needs "
        "matplotlib (ember[report]).",
    )
    report.add_argument("artifact_dir", metavar="ARTIFACT_DIR",
                        help="the artifact folder of a fit (its train/, valid/, checkpoint/)")
    report.add_argument("--out", metavar="DIR",
                        help="where to write the report (default: ARTIFACT_DIR/report)")
    report.set_defaults(run=_report)

    train = steps.add_parser(
        "train",
        help="train the model with the learner",
        description="Trains the guide's model with the learner and "
        "saves it in the artifact folder.",
    )
    train.add_argument(
        "--artifact-dir",
        default=DEFAULT_ARTIFACT_DIR,
        metavar="DIR",
        help=f"where the run's files go (default: {DEFAULT_ARTIFACT_DIR})",
    )
    _add_training_options(train)
    train.add_argument(
        "--renderer",
        choices=("auto", "dashboard", "plain"),
        default="auto",
        help="auto: the dashboard on a terminal, plain lines otherwise",
    )
    train.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write TensorBoard event files to ARTIFACT_DIR/tensorboard "
        "(needs ember[tensorboard])",
    )
    train.add_argument(
        "--mlflow",
        nargs="?",
        const="",
        metavar="URI",
        help="also record the run in MLflow, at the tracking URI given, else at "
        "MLFLOW_TRACKING_URI, else in sqlite:///ARTIFACT_DIR/mlflow.db (needs ember[mlflow])",
    )
    train.add_argument(
        "--nproc",
        type=_at_least(1),
        default=1,
        metavar="N",
        help="train data-parallel in N processes on this machine, each on its own part of "
        "every epoch with --batch-size digits per step (default: 1; see `ember launch`)",
    )
    train.add_argument(
        "--limit",
        type=_at_least(1),
        metavar="N",
        help="train and validate on the first N digits of each split only (a quick run)",
    )
    train.set_defaults(run=_train)

    infer = steps.add_parser(
        "infer",
        help="classify test digits with the trained model",
        description="Loads the trained model and prints its predictions for the first test digits.",
    )
    infer.add_argument(
        "--artifact-dir",
        default=DEFAULT_ARTIFACT_DIR,
        metavar="DIR",
        help=f"the folder of a training run (default: {DEFAULT_ARTIFACT_DIR})",
    )
    infer.add_argument(
        "--count",
        type=_at_least(1),
        default=10,
        metavar="N",
        help="how many test digits to classify (default: 10)",
    )
    infer.add_argument(
        "--quantize",
        choices=("int8", "int4", "int8-static"),  # ember.guide.inference.QUANTIZE_CHOICES
        help="run the model quantized: int8 or int4 weights (weight-only), or int8 weights "
        "and inputs calibrated on training digits (int8-static)",
    )
    _add_device_options(infer)
    infer.set_defaults(run=_infer)

    loop = steps.add_parser(
        "custom-loop",
        help="train with a hand-written loop",
        description="Trains the guide's model with a loop written out "
        "by hand (no learner), printing losses and accuracies.",
    )
    _add_training_options(loop)
    loop.add_argument(
        "--log-every",
        type=_at_least(0),
        default=100,
        metavar="N",
        help="a line every N training iterations; 0: epoch lines only (default: 100)",
    )
    loop.set_defaults(run=_custom_loop)
    return parser


def _device(args: argparse.Namespace) -> Device:
    """The backend's device, wrapped in the Fusion decorator with ``--fusion`` (training
    wraps it in Autodiff in turn: autodiff(fusion(backend)))."""
    on = device(args.backend, args.device)
    return on.fusion() if args.fusion else on


def _training_config(args: argparse.Namespace, on: Device) -> TrainingConfig:
    from ember.guide.training import default_config

    config = default_config()
    options = {
        "num_epochs": args.epochs,
        "batch_size": args.batch_size,
        "num_workers": args.num_workers,
        "seed": args.seed,
        "learning_rate": args.lr,
    }
    if options["num_workers"] is None and on.place == "cuda":
        options["num_workers"] = 1  # measured fastest on CUDA (ember.data.dataloader.loader)
    for name, value in options.items():
        if value is not None:
            config = getattr(config, f"with_{name}")(value)
    return config


def _trackers(args: argparse.Namespace) -> list[ExperimentTracker]:
    """The experiment trackers that ``--tensorboard`` and ``--mlflow`` ask for."""
    trackers: list[ExperimentTracker] = []
    if args.tensorboard:
        from ember.train.tracker import TensorBoardTracker

        trackers.append(TensorBoardTracker())
    if args.mlflow is not None:
        from ember.train.tracker import MlflowTracker

        trackers.append(MlflowTracker(args.mlflow or None, experiment="ember-guide"))
    return trackers


def _train(args: argparse.Namespace) -> None:
    import ember.distributed as dist
    from ember.guide.training import MODEL_FILE, RECORDER, train

    model_path = RECORDER().path_for(Path(args.artifact_dir) / MODEL_FILE)
    in_job = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if args.nproc > 1 and not in_job:  # start the job: this command again in each process
        from ember.distributed.launch import main as launch

        command = ["-m", "ember", *_without_option(args.argv, "--nproc")]
        if launch(["--nproc", str(args.nproc), "--master-port", "0", *command]) != 0:
            raise dist.DistributedError("the data-parallel run failed (the failed rank's error "
                                        "is above)")  # fmt: skip
        return  # rank 0 told where the model is
    if in_job and not dist.is_initialized():
        dist.init()
    on = _device(args)
    renderer: MetricsRenderer | None = None
    if args.renderer == "plain":
        from ember.train.renderer.plain import PlainRenderer

        renderer = PlainRenderer()
    elif args.renderer == "dashboard":
        from ember.train.renderer.dashboard import DashboardRenderer

        renderer = DashboardRenderer()
    datasets = {}
    if args.limit is not None:
        from ember.data.dataset.transform.partial import PartialDataset
        from ember.data.vision.mnist import MnistDataset

        datasets = {"train_dataset": PartialDataset(MnistDataset.train(), 0, args.limit),
                    "valid_dataset": PartialDataset(MnistDataset.test(), 0, args.limit)}  # fmt: skip
    main_process = dist.is_main_process()
    trackers = _trackers(args)
    try:
        train(args.artifact_dir, _training_config(args, on), on, renderer=renderer,
              trackers=trackers, **datasets)  # fmt: skip
    finally:
        dist.shutdown()
    if main_process:
        print(f"The trained model is in {model_path}; try it with "
              f"`ember guide infer --artifact-dir {args.artifact_dir}`")  # fmt: skip


def _without_option(argv: list[str], name: str) -> list[str]:
    """``argv`` without ``name VALUE`` / ``name=VALUE``."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            kept.append(arg)
    return kept


def _infer(args: argparse.Namespace) -> None:
    from ember.guide.inference import infer

    infer(args.artifact_dir, _device(args), count=args.count, quantize=args.quantize)


def _custom_loop(args: argparse.Namespace) -> None:
    from ember.guide.custom_training_loop import run

    on = _device(args)
    run(_training_config(args, on), on, log_every=args.log_every)


def _report(args: argparse.Namespace) -> None:
    from ember.train.report import write_report

    print(f"Training report: {write_report(args.artifact_dir, out=args.out)}")


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the ``ember`` command with ``argv`` (default: the process's arguments).

    Returns 0 on success; exits with status 1 after an ember error (its message on
    standard error) and 2 after a usage error.
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["onnx"]:
        from ember.onnx.cli import main as onnx_main

        return onnx_main(arguments[1:])
    if arguments[:1] == ["launch"]:
        from ember.distributed.launch import main as launch_main

        return launch_main(arguments[1:])
    if arguments[:1] == ["bench"]:
        from ember.bench.cli import main as bench_main

        return bench_main(arguments[1:])
    parser = build_parser()
    args = parser.parse_args(arguments)
    args.argv = arguments
    try:
        args.run(args)
    except EmberError as error:
        command = " ".join([parser.prog, args.command, *([args.step] if "step" in args else [])])
        parser.exit(1, f"{command}: error: {error}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
