"""``ember onnx export guide``: the guide's saved model as an ONNX file that onnxruntime
runs with the same predictions as ember."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX export needs the onnx package (ember[onnx])")
pytest.importorskip("onnxruntime")

from export_helpers import run_onnxruntime

import ember
from ember import Tensor
from ember.guide.inference import load_trained
from ember.guide.model import ModelConfig
from ember.guide.training import CONFIG_FILE, MODEL_FILE, RECORDER, TrainingConfig
from ember.onnx.cli import main
from ember.optim import AdamConfig

DEVICE = ember.device("ndarray")


@pytest.fixture
def artifacts(tmp_path):
    """A guide artifact folder as ``ember guide train`` leaves it (untrained weights)."""
    folder = tmp_path / "run"
    folder.mkdir()
    config = TrainingConfig(ModelConfig(num_classes=10, hidden_size=16), AdamConfig())
    config.save(folder / CONFIG_FILE)
    config.model.init(DEVICE).save_file(folder / MODEL_FILE, RECORDER())
    return folder


def test_the_guide_model_exports_and_predicts_as_ember(artifacts, tmp_path, capsys):
    out = tmp_path / "guide.onnx"
    assert main(["export", "guide", "--artifact-dir", str(artifacts), "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    _config, model = load_trained(artifacts, DEVICE)
    images = Tensor.from_data(np.random.default_rng(0).standard_normal((4, 28, 28)).astype(
        np.float32), DEVICE)  # fmt: skip
    (logits,) = run_onnxruntime(out, [images])
    want = model(images).to_numpy()
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)
    assert (logits.argmax(1) == want.argmax(1)).all()


def test_a_folder_without_a_trained_model_is_an_error_message(tmp_path, capsys):
    code = main(["export", "guide", "--artifact-dir", str(tmp_path), "--out",
                 str(tmp_path / "m.onnx")])  # fmt: skip
    assert code == 1
    assert "no trained model" in capsys.readouterr().err
    assert not (tmp_path / "m.onnx").exists()
