"""The guide: its model against PyTorch, its batcher on real digits, train / infer / the CLI.

The runs here are tiny (a few hundred MNIST digits, one or two epochs): they check what
the guide writes and prints, not how well it learns. How well it learns is checked by
``scripts/check_guide_accuracy.py`` (a full run of several minutes).
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import ember
from ember import Tensor
from ember.backend.errors import ArgumentError, ShapeError
from ember.backends import fusion
from ember.backends.fusion.numba_runtime import available as numba_available
from ember.cli import main
from ember.data.dataset.transform.partial import PartialDataset
from ember.data.vision.mnist import MnistDataset
from ember.guide.custom_training_loop import run
from ember.guide.data import MnistBatcher
from ember.guide.inference import NoTrainedModelError, infer, load_trained
from ember.guide.model import ModelConfig
from ember.guide.training import TrainingConfig, default_config, train
from ember.tensor import Kind
from ember.train.renderer.plain import PlainRenderer

NDARRAY = ember.device("ndarray")


@pytest.fixture(scope="module")
def digits() -> tuple[PartialDataset, PartialDataset]:
    """256 training digits and 128 test digits: four training and two validation batches."""
    return PartialDataset(MnistDataset.train(), 0, 256), PartialDataset(MnistDataset.test(), 0, 128)


@pytest.fixture(scope="module")
def trained(digits, tmp_path_factory):
    """A one-epoch run on the small digits: (artifact folder, config, trained model, output)."""
    folder = tmp_path_factory.mktemp("guide")
    config = default_config().with_num_epochs(1)
    stream = io.StringIO()
    model = train(
        folder,
        config,
        NDARRAY,
        renderer=PlainRenderer(every=2, stream=stream),
        train_dataset=digits[0],
        valid_dataset=digits[1],
    )
    return folder, config, model, stream.getvalue()


# ---------------------------------------------------------------------- the model
def torch_guide_model(hidden: int, classes: int) -> torch.nn.Sequential:
    """The book's network in PyTorch, in inference mode (dropout is the identity)."""
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 28)),
        torch.nn.Conv2d(1, 8, 3),
        torch.nn.Dropout(0.5),
        torch.nn.Conv2d(8, 16, 3),
        torch.nn.Dropout(0.5),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d((8, 8)),
        torch.nn.Flatten(),
        torch.nn.Linear(1024, hidden),
        torch.nn.Dropout(0.5),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, classes),
    ).eval()


def test_model_matches_the_book_and_pytorch():
    model = ModelConfig(num_classes=10, hidden_size=512).init(NDARRAY)
    reference = torch_guide_model(512, 10)
    assert model.num_params() == sum(p.numel() for p in reference.parameters())
    # Burn and ember store a linear weight [in, out]; PyTorch stores the transpose.
    with torch.no_grad():
        for layer, ours in ((reference[1], model.conv1), (reference[3], model.conv2)):
            layer.weight.copy_(torch.from_numpy(np.asarray(ours.weight.val().tolist())))
            layer.bias.copy_(torch.from_numpy(np.asarray(ours.bias.val().tolist())))
        for layer, ours in ((reference[8], model.linear1), (reference[11], model.linear2)):
            layer.weight.copy_(torch.from_numpy(np.asarray(ours.weight.val().tolist())).T)
            layer.bias.copy_(torch.from_numpy(np.asarray(ours.bias.val().tolist())))
    images = np.random.default_rng(0).normal(size=(3, 28, 28)).astype(np.float32)
    output = model(Tensor.from_data(images, NDARRAY))
    assert output.shape == (3, 10)
    expected = reference(torch.from_numpy(images)).detach().numpy()
    np.testing.assert_allclose(np.asarray(output.tolist()), expected, atol=1e-5, rtol=1e-4)


def test_model_rejects_images_without_a_batch_dim():
    model = ModelConfig(num_classes=10, hidden_size=16).init(NDARRAY)
    with pytest.raises(
        ShapeError, match=r"Model: expected images \[batch, height, width\], got shape \[28, 28\]"
    ):
        model(Tensor.zeros([28, 28], NDARRAY))


def test_model_config_defaults_and_checks():
    assert ModelConfig(10, 512).dropout == 0.5
    with pytest.raises(ember.ConfigError, match="dropout"):
        ModelConfig(10, 512, dropout=1.5)


# ---------------------------------------------------------------------- the batcher
def test_batcher_normalizes_real_digits():
    dataset = MnistDataset.test()
    items = [dataset[i] for i in (0, 1, 7)]
    batch = MnistBatcher().batch(items, NDARRAY)
    pixels = np.stack([item.image for item in items]).astype(np.float64)
    expected = (pixels / 255 - 0.1307) / 0.3081
    assert batch.images.shape == (3, 28, 28) and batch.images.kind == Kind.FLOAT
    np.testing.assert_allclose(np.asarray(batch.images.tolist()), expected, atol=1e-6)
    assert batch.targets.kind == Kind.INT
    assert batch.targets.tolist() == [int(dataset.labels[i]) for i in (0, 1, 7)]


def test_batcher_rejects_no_items():
    with pytest.raises(ArgumentError, match="MnistBatcher: cannot make a batch of no items"):
        MnistBatcher().batch([], NDARRAY)


# ---------------------------------------------------------------------- train / infer
def test_train_writes_the_artifacts(trained):
    folder, config, model, output = trained
    assert TrainingConfig.load(folder / "config.json") == config
    assert json.loads((folder / "config.json").read_text())["model"]["hidden_size"] == 512
    for path in (
        "model.mpk.gz",
        "experiment.log",
        "checkpoint/model-1.mpk.gz",
        "checkpoint/optim-1.mpk.gz",
        "checkpoint/state-1.json",
    ):
        assert (folder / path).is_file(), path
    for split in ("train", "valid"):
        for metric in ("Accuracy", "Loss"):
            assert (folder / split / "epoch-1" / f"{metric}.log").is_file(), (split, metric)
    assert "[train] epoch 1/1 iteration 2 items 128/256" in output
    assert "[valid] epoch 1/1 done | Accuracy" in output

    # The saved model is the trained one, at half precision.
    _, loaded = load_trained(folder, NDARRAY)
    for ours, theirs in ((model.linear1, loaded.linear1), (model.conv1, loaded.conv1)):
        np.testing.assert_allclose(
            np.asarray(theirs.weight.val().tolist()),
            np.asarray(ours.weight.val().tolist()),
            rtol=1e-3,
            atol=1e-4,
        )


def test_infer_prints_predicted_and_expected(trained, digits, capsys):
    folder, _, model, _ = trained
    test = digits[1]
    results = infer(folder, NDARRAY, count=5, dataset=test)
    lines = capsys.readouterr().out.splitlines()
    assert len(results) == 5 and len(lines) == 6
    logits = np.asarray(
        model.valid()(MnistBatcher().batch([test[i] for i in range(5)], NDARRAY).images).tolist()
    )
    for i, (predicted, expected) in enumerate(results):
        assert expected == test[i].label
        assert lines[i].startswith(f"test item {i}: predicted {predicted}, expected {expected}")
        top2 = np.sort(logits[i])[-2:]
        if top2[1] - top2[0] > 0.05:  # a near tie may flip with the half-precision record
            assert predicted == int(np.argmax(logits[i]))
    assert lines[5] == f"{sum(p == e for p, e in results)} of 5 correct"

    [(predicted, expected)] = infer(folder, NDARRAY.autodiff(), test[3])
    assert capsys.readouterr().out == f"item: predicted {predicted}, expected {expected}" + (
        "\n" if predicted == expected else "  (wrong)\n"
    )


def test_infer_errors(trained, tmp_path, digits):
    with pytest.raises(
        NoTrainedModelError,
        match=f"no trained model in {tmp_path} .*: run "
        f"`ember guide train --artifact-dir {tmp_path}` first",
    ):
        infer(tmp_path, NDARRAY)
    with pytest.raises(ArgumentError, match=r"infer: count must be an integer from 1 to 128"):
        infer(trained[0], NDARRAY, count=129, dataset=digits[1])


def test_custom_loop_learns_on_a_few_digits(digits, capsys):
    config = default_config().with_num_epochs(2).with_learning_rate(1e-3)
    _, results = run(config, NDARRAY, log_every=2, train_dataset=digits[0], valid_dataset=digits[1])
    out = capsys.readouterr().out.splitlines()
    assert [r.epoch for r in results] == [1, 2]
    assert results[1].train_loss < results[0].train_loss
    assert all(0 <= r.valid_accuracy <= 100 for r in results)
    assert out[0].startswith("[Train - Epoch 1 - Iteration 2] loss ")
    assert out[2].startswith(
        f"[Epoch 1] train: loss {results[0].train_loss:.4f} accuracy "
        f"{results[0].train_accuracy:.2f}%"
    )


# ---------------------------------------------------------------------- the CLI
@pytest.fixture
def small_mnist(monkeypatch, digits):
    """The CLI's runs on the small digits instead of the whole splits."""

    class SmallMnist:
        @staticmethod
        def train():
            return digits[0]

        @staticmethod
        def test():
            return digits[1]

    monkeypatch.setattr("ember.guide.training.MnistDataset", SmallMnist)
    monkeypatch.setattr("ember.guide.inference.MnistDataset", SmallMnist)


def test_cli_train_then_infer(small_mnist, tmp_path, capsys):
    folder = tmp_path / "run"
    assert (
        main(
            [
                "guide",
                "train",
                "--artifact-dir",
                str(folder),
                "--epochs",
                "1",
                "--lr",
                "0.001",
                "--seed",
                "3",
                "--renderer",
                "plain",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "[valid] epoch 1/1 done" in out
    assert f"The trained model is in {folder / 'model.mpk.gz'}" in out
    config = TrainingConfig.load(folder / "config.json")
    assert (config.num_epochs, config.learning_rate, config.seed) == (1, 0.001, 3)
    assert (config.batch_size, config.num_workers) == (64, 0)

    assert main(["guide", "infer", "--artifact-dir", str(folder), "--count", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines[:3]] == [
        "test item 0",
        "test item 1",
        "test item 2",
    ]
    assert lines[3].endswith("of 3 correct")
    assert main(["guide", "infer", "--artifact-dir", str(folder), "--count", "3",
                 "--quantize", "int8"]) == 0  # fmt: skip
    assert capsys.readouterr().out.splitlines()[3].endswith("of 3 correct")


def test_cli_custom_loop(small_mnist, capsys):
    assert main(["guide", "custom-loop", "--epochs", "1", "--log-every", "0"]) == 0
    assert capsys.readouterr().out.startswith("[Epoch 1] train: loss ")


def test_cli_infer_before_train(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["guide", "infer", "--artifact-dir", str(tmp_path)])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err == (
        f"ember guide infer: error: no trained model in {tmp_path} (missing config.json, "
        f"model.mpk.gz): run `ember guide train --artifact-dir {tmp_path}` first\n"
    )


def test_python_dash_m_ember_is_the_command(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "ember", "guide", "infer", "--artifact-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith(f"ember guide infer: error: no trained model in {tmp_path}")


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (
            ["guide", "train", "--epochs", "0"],
            2,
            "argument --epochs: expected an integer >= 1, got '0'",
        ),
        (
            ["guide", "train", "--lr", "-1"],
            2,
            "argument --lr: expected a positive number, got '-1'",
        ),
        (["guide", "infer", "--backend", "jax"], 2, "argument --backend: invalid choice: 'jax'"),
        (["guide", "infer", "--device", "cuda:0"], 1, "backend 'ndarray' has no 'cuda' devices"),
        (["guide"], 2, "the following arguments are required: STEP"),
    ],
)
def test_cli_errors(argv, code, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == code
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------------- --fusion
def _weights(model) -> list[np.ndarray]:
    layers = (model.conv1, model.conv2, model.linear1, model.linear2)
    return [
        np.asarray(t.val().to_data().to_numpy())
        for layer in layers
        for t in (layer.weight, layer.bias)
    ]


def _fused_run(digits, fused_device):
    """The custom loop (one epoch, four training and two validation batches) on ndarray
    and on ``fused_device``: (plain results, plain model, fused results, fused model, stats)."""
    config = default_config().with_num_epochs(1).with_learning_rate(1e-3)
    plain_model, plain = run(
        config, NDARRAY, log_every=0, train_dataset=digits[0], valid_dataset=digits[1]
    )
    fusion.reset_stats()
    fused_model, fused = run(
        config, fused_device, log_every=0, train_dataset=digits[0], valid_dataset=digits[1]
    )
    return plain, plain_model, fused, fused_model, fusion.stats()


def test_custom_loop_on_fusion_matches_ndarray(digits, capsys):
    # The interpreter runs fused blocks with NdArray's own kernels: the same numbers.
    plain, plain_model, fused, fused_model, counts = _fused_run(
        digits, NDARRAY.fusion(runtime="interpreter")
    )
    assert fused_model.conv1.weight.val().device.backend.name == "autodiff<fusion<ndarray>>"
    for ours, theirs in zip(fused, plain):
        np.testing.assert_allclose(
            [ours.train_loss, ours.valid_loss], [theirs.train_loss, theirs.valid_loss], rtol=1e-6
        )
        assert (ours.train_accuracy, ours.valid_accuracy) == (
            theirs.train_accuracy,
            theirs.valid_accuracy,
        )
    for ours, theirs in zip(_weights(fused_model), _weights(plain_model)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)
    assert counts["kernels"] > 0 and counts["fused_ops"] > 2 * counts["kernels"], counts
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0] == out[1]  # the same epoch line, to four decimals


def _epoch_numbers(line: str) -> list[float]:
    return [float(n) for n in re.findall(r"\d+\.\d+", line)]


def test_cli_fusion_train_infer_and_custom_loop(small_mnist, tmp_path, capsys, monkeypatch):
    # The user's path: compiled kernels (numba's f32 exp/log within a few ulp), so close to
    # the run without fusion, not equal. Where numba is missing, the interpreter runs them.
    if not numba_available():
        monkeypatch.setenv("EMBER_FUSION_RUNTIME", "interpreter")
    plain, fused = tmp_path / "plain", tmp_path / "fused"
    fusion.reset_stats()
    for folder, extra in ((plain, []), (fused, ["--fusion"])):
        argv = ["guide", "train", "--artifact-dir", str(folder), "--epochs", "1", "--lr", "0.001"]
        assert main([*argv, "--renderer", "plain", *extra]) == 0
    counts = fusion.stats()
    assert counts["kernels"] > 0 and counts["fused_ops"] > 2 * counts["kernels"], counts
    assert "[valid] epoch 1/1 done" in capsys.readouterr().out
    for path in ("train/epoch-1/Loss.log", "valid/epoch-1/Loss.log"):  # every iteration's loss
        ours, theirs = np.loadtxt(fused / path, ndmin=1), np.loadtxt(plain / path, ndmin=1)
        assert ours.shape == theirs.shape == ((4,) if path.startswith("train") else (2,))
        np.testing.assert_allclose(ours, theirs, rtol=1e-5)

    fusion.reset_stats()
    assert main(["guide", "infer", "--artifact-dir", str(fused), "--count", "3", "--fusion"]) == 0
    with_fusion = capsys.readouterr().out
    assert fusion.stats()["records"] > 0  # the model ran on the fusion device
    assert main(["guide", "infer", "--artifact-dir", str(fused), "--count", "3"]) == 0
    assert capsys.readouterr().out == with_fusion

    assert main(["guide", "custom-loop", "--epochs", "1", "--log-every", "0", "--fusion"]) == 0
    fused_line = capsys.readouterr().out
    assert main(["guide", "custom-loop", "--epochs", "1", "--log-every", "0"]) == 0
    plain_line = capsys.readouterr().out
    assert fused_line.startswith("[Epoch 1] train: loss ")
    np.testing.assert_allclose(_epoch_numbers(fused_line), _epoch_numbers(plain_line), atol=2e-4)


def test_infer_quantized_agrees_with_float(trained, digits, capsys, tmp_path):
    # Weight-only int8 changes almost no prediction of the (barely trained) model; int4 (16
    # levels) changes more, but not its accuracy by much.
    folder = trained[0]
    test = digits[1]
    exact = infer(folder, NDARRAY, count=128, dataset=test)
    capsys.readouterr()

    def accuracy(results) -> float:
        return sum(p == e for p, e in results) / len(results)

    int8 = infer(folder, NDARRAY, count=128, dataset=test, quantize="int8")
    assert sum(p != q for (p, _), (q, _) in zip(exact, int8)) <= 2
    int4 = infer(folder, NDARRAY, count=128, dataset=test, quantize="int4")
    assert accuracy(int4) >= accuracy(exact) - 0.08, (accuracy(int4), accuracy(exact))
    # Static: the inputs too, calibrated on (here) the training digits of the fixture.
    static = infer(folder, NDARRAY, count=128, dataset=test, quantize="int8-static",
                   calibration=digits[0])  # fmt: skip
    assert sum(p != q for (p, _), (q, _) in zip(exact, static)) <= 4
    # The records: int8 about 4x smaller than f32 (the guide's target: at least 3.5x).
    from ember.guide.inference import quantized

    model = load_trained(folder, NDARRAY)[1]
    sizes = {v: (model if v == "f32" else quantized(model, v, NDARRAY, digits[0]))
             .save_file(tmp_path / v).stat().st_size for v in ("f32", "int8", "int8-static")}  # fmt: skip
    assert sizes["f32"] / sizes["int8"] >= 3.5 and sizes["f32"] / sizes["int8-static"] >= 3.5, sizes
    with pytest.raises(ArgumentError, match="quantize must be one of 'int8', 'int4', 'int8-static'"):
        infer(folder, NDARRAY, count=2, dataset=test, quantize="int2")


def test_cli_train_with_trackers(small_mnist, tmp_path, capsys):
    """``--tensorboard --mlflow URI``: both trackers follow the guide's run, with its config."""
    pytest.importorskip("tensorboardX", reason="the 'tensorboard' extra is not installed")
    pytest.importorskip("mlflow", reason="the 'mlflow' extra is not installed")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder, uri = tmp_path / "run", f"sqlite:///{tmp_path / 'runs.db'}"
    assert main(["guide", "train", "--artifact-dir", str(folder), "--epochs", "1", "--seed", "3",
                 "--renderer", "plain", "--tensorboard", "--mlflow", uri]) == 0  # fmt: skip
    capsys.readouterr()
    events = EventAccumulator(str(folder / "tensorboard" / "valid")).Reload()
    assert [p.step for p in events.Scalars("Loss")] == [1, 2]  # 128 test digits, batches of 64
    client = MlflowClient(tracking_uri=uri)
    [run] = client.search_runs([client.get_experiment_by_name("ember-guide").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["seed"] == "3" and run.data.params["model.num_classes"] == "10"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/Loss")] == [1, 2, 3, 4]
