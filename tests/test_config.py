"""ember.Config: typed, frozen, validated configs with with_ builders and atomic JSON files."""

import enum
import json
import os
from pathlib import Path
from typing import Literal

import pytest

import ember
from ember import Config, ConfigError
from ember.atomic import atomic_write
from ember.backend.errors import ConfigFileNotFoundError


class Activation(enum.Enum):
    RELU = "relu"
    GELU = "gelu"


class ModelConfig(Config):
    num_classes: int
    hidden_size: int
    dropout: float = 0.5


class OptimizerConfig(Config):
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float | None = None


class TrainingConfig(Config):
    model: ModelConfig
    optimizer: OptimizerConfig = OptimizerConfig()
    epochs: int = 10
    activation: Activation = Activation.RELU
    milestones: list[int] = [30, 60]
    kernel: tuple[int, ...] = (3, 3)
    seed: int | None = None
    schedule: Literal["constant", "cosine"] = "constant"


def training() -> TrainingConfig:
    return TrainingConfig(model=ModelConfig(10, 512))


# ------------------------------------------------------------------ construction


def test_exports():
    assert ember.Config is Config
    assert ember.ConfigError is ConfigError
    assert issubclass(ConfigError, ember.EmberError)
    assert issubclass(ConfigError, ValueError)
    assert issubclass(ConfigFileNotFoundError, ConfigError)
    assert issubclass(ConfigFileNotFoundError, FileNotFoundError)


def test_defaults_and_required_fields():
    config = ModelConfig(num_classes=10, hidden_size=512)
    assert config.num_classes == 10
    assert config.hidden_size == 512
    assert config.dropout == 0.5


def test_required_fields_positionally_in_declaration_order():
    assert ModelConfig(10, 512) == ModelConfig(num_classes=10, hidden_size=512)
    assert ModelConfig(10, hidden_size=512, dropout=0.1).dropout == 0.1


def test_too_many_positional_values():
    with pytest.raises(ConfigError) as info:
        ModelConfig(1, 2, 0.3)
    assert str(info.value) == (
        "ModelConfig: takes at most 2 positional value(s) "
        "(the required fields num_classes, hidden_size), got 3"
    )


def test_value_given_positionally_and_by_name():
    with pytest.raises(ConfigError, match=r"^ModelConfig.num_classes: given both positionally"):
        ModelConfig(1, 2, num_classes=3)


def test_int_is_accepted_for_float():
    config = ModelConfig(1, 2, dropout=0)
    assert config.dropout == 0.0
    assert isinstance(config.dropout, float)


def test_repr_str_and_equality():
    config = ModelConfig(10, 512)
    assert repr(config) == "ModelConfig(num_classes=10, hidden_size=512, dropout=0.5)"
    assert str(config) == repr(config)
    assert config == ModelConfig(10, 512)
    assert config != ModelConfig(10, 512, dropout=0.1)
    assert hash(config) == hash(ModelConfig(10, 512))


def test_nested_repr():
    assert repr(TrainingConfig(model=ModelConfig(1, 2), milestones=[])) == (
        "TrainingConfig(model=ModelConfig(num_classes=1, hidden_size=2, dropout=0.5), "
        "optimizer=OptimizerConfig(lr=0.001, betas=(0.9, 0.999), weight_decay=None), "
        "epochs=10, activation=<Activation.RELU: 'relu'>, milestones=[], kernel=(3, 3), "
        "seed=None, schedule='constant')"
    )


def test_frozen():
    config = ModelConfig(10, 512)
    with pytest.raises(AttributeError, match=r"ModelConfig is frozen: use with_dropout\(...\)"):
        config.dropout = 0.1  # type: ignore[misc]
    with pytest.raises(AttributeError, match=r"has no field 'bogus' \(known fields: num_classes"):
        config.bogus = 1
    with pytest.raises(AttributeError, match="frozen"):
        del config.dropout
    assert config.dropout == 0.5


def test_default_lists_are_not_shared():
    a, b = training(), training()
    a.milestones.append(90)
    assert b.milestones == [30, 60]


def test_no_init_on_the_base_class():
    assert not hasattr(Config, "init")


# ------------------------------------------------------------ validation errors


def test_wrong_type():
    with pytest.raises(ConfigError) as info:
        ModelConfig(10, "abc")
    assert str(info.value) == "ModelConfig.hidden_size: expected an integer, got 'abc'"
    assert info.value.fields == ("ModelConfig.hidden_size",)
    assert info.value.file is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hidden_size": 2.0}, "ModelConfig.hidden_size: expected an integer, got 2.0"),
        ({"hidden_size": True}, "ModelConfig.hidden_size: expected an integer, got True"),
        ({"hidden_size": "512"}, "ModelConfig.hidden_size: expected an integer, got '512'"),
        ({"dropout": "0.1"}, "ModelConfig.dropout: expected a number, got '0.1'"),
    ],
)
def test_no_silent_conversion(kwargs, message):
    values = {"num_classes": 1, "hidden_size": 2, **kwargs}
    with pytest.raises(ConfigError) as info:
        ModelConfig(**values)
    assert str(info.value) == message


def test_missing_field():
    with pytest.raises(ConfigError) as info:
        ModelConfig(10)
    assert str(info.value) == "ModelConfig.hidden_size: missing required field"


def test_unknown_field():
    with pytest.raises(ConfigError) as info:
        ModelConfig(10, 512, hiden_size=3)
    assert str(info.value) == (
        "ModelConfig.hiden_size: unknown field (known fields: num_classes, hidden_size, dropout)"
    )


def test_several_errors_are_all_listed():
    with pytest.raises(ConfigError) as info:
        TrainingConfig(model=ModelConfig(1, 2), epochs="x", milestones=[1, "a"])
    assert str(info.value) == (
        "TrainingConfig: 2 errors\n"
        "  TrainingConfig.epochs: expected an integer, got 'x'\n"
        "  TrainingConfig.milestones[1]: expected an integer, got 'a'"
    )
    assert info.value.fields == ("TrainingConfig.epochs", "TrainingConfig.milestones[1]")


def test_enum_and_literal_errors():
    with pytest.raises(
        ConfigError, match=r"^TrainingConfig.schedule: expected 'constant' or 'cosine', got 'step'$"
    ):
        training().with_schedule("step")
    with pytest.raises(
        ConfigError,
        match=r"^TrainingConfig.activation: expected an instance of Activation, got 'relu'$",
    ):
        training().with_activation("relu")


def test_tuple_length_is_checked():
    with pytest.raises(
        ConfigError, match=r"^OptimizerConfig.betas: tuple should have at most 2 items"
    ):
        OptimizerConfig(betas=(0.9, 0.99, 0.999))


# ------------------------------------------------------------------ with_ builders


def test_with_returns_a_new_config():
    config = ModelConfig(10, 512)
    changed = config.with_dropout(0.2)
    assert changed == ModelConfig(10, 512, dropout=0.2)
    assert config.dropout == 0.5
    assert changed is not config
    assert type(changed) is ModelConfig


def test_with_exists_for_every_field():
    for name in TrainingConfig.model_fields:
        assert callable(getattr(training(), f"with_{name}"))
    assert TrainingConfig.with_epochs.__doc__ == (
        "Returns a new, validated copy of this config with ``epochs`` set to ``value``."
    )


def test_with_validates():
    with pytest.raises(ConfigError) as info:
        ModelConfig(10, 512).with_hidden_size("abc")
    assert str(info.value) == "ModelConfig.hidden_size: expected an integer, got 'abc'"


def test_with_unknown_field():
    with pytest.raises(AttributeError) as info:
        ModelConfig(10, 512).with_hiden_size(3)
    assert str(info.value) == (
        "ModelConfig has no field 'hiden_size', so no with_hiden_size() builder "
        "(known fields: num_classes, hidden_size, dropout)"
    )


def test_unknown_plain_attribute_is_a_normal_attribute_error():
    with pytest.raises(AttributeError, match="bogus"):
        _ = ModelConfig(1, 2).bogus


def test_with_on_nested_fields():
    config = training()
    changed = config.with_model(config.model.with_hidden_size(1024)).with_optimizer(
        config.optimizer.with_lr(0.1).with_betas((0.5, 0.6))
    )
    assert changed.model == ModelConfig(10, 1024)
    assert changed.optimizer == OptimizerConfig(lr=0.1, betas=(0.5, 0.6))
    assert config.model.hidden_size == 512
    assert config.optimizer.lr == 1e-3
    with pytest.raises(ConfigError, match=r"^TrainingConfig.model: expected"):
        config.with_model(OptimizerConfig())


def test_with_on_optional_and_enum_fields():
    config = training().with_seed(7).with_activation(Activation.GELU)
    assert config.seed == 7
    assert config.activation is Activation.GELU
    assert config.with_seed(None).seed is None


def test_subclass_gets_builders_for_inherited_and_new_fields():
    class WideConfig(ModelConfig):
        width: int = 4

    config = WideConfig(1, 2).with_width(8).with_dropout(0.0)
    assert config == WideConfig(1, 2, dropout=0.0, width=8)
    assert type(config) is WideConfig


def test_a_hand_written_builder_is_kept():
    class Custom(Config):
        x: int = 1

        def with_x(self, value: int) -> "Custom":
            return self._with("x", value * 10)

    class Child(Custom):
        y: int = 0

    assert Custom().with_x(2).x == 20
    assert Child().with_x(3).x == 30


# ---------------------------------------------------------------- dict and JSON


def test_to_dict_is_plain_data():
    assert training().to_dict() == {
        "model": {"num_classes": 10, "hidden_size": 512, "dropout": 0.5},
        "optimizer": {"lr": 0.001, "betas": [0.9, 0.999], "weight_decay": None},
        "epochs": 10,
        "activation": "relu",
        "milestones": [30, 60],
        "kernel": [3, 3],
        "seed": None,
        "schedule": "constant",
    }


def test_from_dict_round_trip():
    config = training().with_seed(3).with_activation(Activation.GELU).with_kernel((5, 5, 5))
    again = TrainingConfig.from_dict(config.to_dict())
    assert again == config
    assert again.kernel == (5, 5, 5)
    assert again.activation is Activation.GELU
    assert isinstance(again.model, ModelConfig)


def test_from_dict_accepts_python_values_and_config_instances():
    config = TrainingConfig.from_dict(
        {"model": ModelConfig(1, 2), "activation": Activation.GELU, "kernel": (1,)}
    )
    assert config.model == ModelConfig(1, 2)
    assert config.activation is Activation.GELU
    assert config.kernel == (1,)


def test_from_dict_errors():
    with pytest.raises(ConfigError) as info:
        TrainingConfig.from_dict({"model": {"num_classes": 1}, "bogus": 1})
    assert str(info.value) == (
        "TrainingConfig: 2 errors\n"
        "  TrainingConfig.model.hidden_size: missing required field\n"
        "  TrainingConfig.bogus: unknown field (known fields: model, optimizer, epochs, "
        "activation, milestones, kernel, seed, schedule)"
    )
    with pytest.raises(ConfigError, match=r"^ModelConfig: expected a mapping of field names"):
        ModelConfig.from_dict([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^ModelConfig: the data is not plain data"):
        ModelConfig.from_dict({"num_classes": object(), "hidden_size": 1})


def test_to_json_is_pretty():
    assert ModelConfig(10, 512).to_json() == (
        '{\n  "num_classes": 10,\n  "hidden_size": 512,\n  "dropout": 0.5\n}'
    )


def test_load_json():
    assert ModelConfig.load_json('{"num_classes": 3, "hidden_size": 4}') == ModelConfig(3, 4)
    assert ModelConfig.load_json(b'{"num_classes": 3, "hidden_size": 4}') == ModelConfig(3, 4)


def test_load_json_errors():
    with pytest.raises(ConfigError, match=r"^ModelConfig: malformed JSON: EOF while parsing"):
        ModelConfig.load_json('{"num_classes": ')
    with pytest.raises(ConfigError, match=r"^ModelConfig: expected an object, got \[1, 2\]$"):
        ModelConfig.load_json("[1, 2]")
    with pytest.raises(ConfigError) as info:
        TrainingConfig.load_json('{"model": {"num_classes": 1, "hidden_size": "abc"}}')
    assert str(info.value) == "TrainingConfig.model.hidden_size: expected an integer, got 'abc'"


def test_non_finite_floats_round_trip():
    config = ModelConfig(1, 2, dropout=float("inf"))
    assert '"dropout": Infinity' in config.to_json()
    assert ModelConfig.load_json(config.to_json()) == config


# ---------------------------------------------------------------------- files


def test_save_load_round_trip(tmp_path: Path):
    config = (
        training()
        .with_optimizer(OptimizerConfig(lr=0.5, betas=(0.1, 0.2), weight_decay=1e-4))
        .with_activation(Activation.GELU)
        .with_milestones([1, 2, 3])
        .with_kernel((7,))
        .with_seed(42)
        .with_schedule("cosine")
    )
    path = tmp_path / "training.json"
    config.save(path)
    assert path.read_text() == config.to_json() + "\n"
    assert json.loads(path.read_text())["optimizer"] == {
        "lr": 0.5,
        "betas": [0.1, 0.2],
        "weight_decay": 0.0001,
    }
    loaded = TrainingConfig.load(path)
    assert loaded == config
    assert loaded.optimizer.betas == (0.1, 0.2)
    assert loaded.activation is Activation.GELU
    assert TrainingConfig.load(str(path)) == config


def test_save_overwrites_and_leaves_no_temporary_file(tmp_path: Path):
    path = tmp_path / "model.json"
    ModelConfig(1, 2).save(path)
    ModelConfig(3, 4).save(path)
    assert ModelConfig.load(path) == ModelConfig(3, 4)
    assert sorted(os.listdir(tmp_path)) == ["model.json"]


def test_save_respects_the_umask(tmp_path: Path):
    old = os.umask(0o022)
    try:
        ModelConfig(1, 2).save(tmp_path / "model.json")
    finally:
        os.umask(old)
    assert (tmp_path / "model.json").stat().st_mode & 0o777 == 0o644


def test_save_into_a_missing_directory(tmp_path: Path):
    path = tmp_path / "missing" / "model.json"
    with pytest.raises(ConfigFileNotFoundError) as info:
        ModelConfig(1, 2).save(path)
    assert str(info.value) == (
        f"cannot save ModelConfig to '{path}': the directory '{path.parent}' does not exist"
    )
    assert isinstance(info.value, FileNotFoundError)
    assert info.value.file == str(path)


def test_load_a_missing_file(tmp_path: Path):
    path = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError) as info:
        ModelConfig.load(path)
    assert isinstance(info.value, ConfigError)
    assert str(info.value) == f"cannot load ModelConfig: the file '{path}' does not exist"


def test_load_a_directory(tmp_path: Path):
    with pytest.raises(ConfigError, match="is a directory"):
        ModelConfig.load(tmp_path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"num_classes": 1, "hidden_size": "abc"}',
            "ModelConfig.hidden_size: expected an integer, got 'abc'",
        ),
        ('{"num_classes": 1}', "ModelConfig.hidden_size: missing required field"),
        (
            '{"num_classes": 1, "hidden_size": 2, "depth": 3}',
            "ModelConfig.depth: unknown field (known fields: num_classes, hidden_size, dropout)",
        ),
        (
            '{"num_classes": 1, "hidden_size": 2.5}',
            "ModelConfig.hidden_size: expected an integer, got 2.5",
        ),
    ],
)
def test_load_errors_name_the_field_and_the_file(tmp_path: Path, text: str, message: str):
    path = tmp_path / "model.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        ModelConfig.load(path)
    assert str(info.value) == f"{message} (in {path})"
    assert info.value.file == str(path)


def test_load_malformed_json(tmp_path: Path):
    path = tmp_path / "model.json"
    path.write_text('{"num_classes": 1,, }')
    with pytest.raises(ValueError) as info:
        ModelConfig.load(path)
    assert isinstance(info.value, ConfigError)
    message = str(info.value)
    assert message.startswith("ModelConfig: malformed JSON: ")
    assert "line 1 column" in message
    assert message.endswith(f"(in {path})")


def test_load_truncated_file(tmp_path: Path):
    path = tmp_path / "training.json"
    text = training().to_json()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ConfigError, match=r"^TrainingConfig: malformed JSON: EOF while parsing"):
        TrainingConfig.load(path)


def test_load_nested_error_in_file(tmp_path: Path):
    path = tmp_path / "training.json"
    data = training().to_dict()
    data["optimizer"]["betas"] = [0.9, "x"]
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        TrainingConfig.load(path)
    assert str(info.value) == (
        f"TrainingConfig.optimizer.betas[1]: expected a number, got 'x' (in {path})"
    )


# -------------------------------------------------------------- atomic writes


def test_failed_serialization_keeps_the_old_file(tmp_path: Path, monkeypatch):
    path = tmp_path / "model.json"
    ModelConfig(1, 2).save(path)
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise RuntimeError("serializer crashed")

    monkeypatch.setattr(ModelConfig, "to_json", boom)
    with pytest.raises(RuntimeError, match="serializer crashed"):
        ModelConfig(3, 4).save(path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["model.json"]


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_crash_during_write_keeps_the_old_file(tmp_path: Path, monkeypatch, failing: str):
    path = tmp_path / "model.json"
    ModelConfig(1, 2).save(path)
    before = path.read_bytes()
    seen: list[str] = []

    def crash(*args, **kwargs):
        # The temporary file exists and holds (part of) the new text when this runs.
        seen.extend(name for name in os.listdir(tmp_path) if name.endswith(".tmp"))
        raise OSError("disk on fire")

    monkeypatch.setattr(os, failing, crash)
    with pytest.raises(OSError, match="disk on fire"):
        ModelConfig(3, 4).save(path)
    monkeypatch.undo()
    assert len(seen) == 1 and seen[0].startswith(".model.json.")
    assert path.read_bytes() == before
    assert ModelConfig.load(path) == ModelConfig(1, 2)
    assert sorted(os.listdir(tmp_path)) == ["model.json"]


def test_interrupted_write_keeps_the_old_file(tmp_path: Path, monkeypatch):
    path = tmp_path / "notes.json"
    atomic_write(path, b"old\n")
    real_fdopen = os.fdopen

    class HalfWriter:
        def __init__(self, file):
            self.file = file

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()
            return False

        def write(self, data):
            self.file.write(data[: len(data) // 2])
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "fdopen", lambda fd, mode: HalfWriter(real_fdopen(fd, mode)))
    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, b"new text that never fully lands\n")
    monkeypatch.undo()
    assert path.read_text() == "old\n"
    assert sorted(os.listdir(tmp_path)) == ["notes.json"]


def test_optional_nested_config():
    class Wrapper(Config):
        inner: ModelConfig | None = None

    assert Wrapper().inner is None
    assert Wrapper.from_dict({"inner": {"num_classes": 1, "hidden_size": 2}}).inner == ModelConfig(
        1, 2
    )
    assert Wrapper.load_json(Wrapper(inner=ModelConfig(1, 2)).to_json()) == Wrapper(
        inner=ModelConfig(1, 2)
    )
    with pytest.raises(ConfigError) as info:
        Wrapper.load_json('{"inner": {"num_classes": 1, "hidden_size": 2, "x": 0}}')
    assert str(info.value) == (
        "Wrapper.inner.x: unknown field (known fields: num_classes, hidden_size, dropout)"
    )
