"""ONNX export refuses what it cannot write, with typed errors, and never leaves a partial
file: an op without an ONNX form (named with the module path where it ran), a forward that
branches on data or on a dynamic size, bad arguments, and paths that cannot be written."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX export needs the onnx package (ember[onnx])")

import ember
from ember import EmberError, Tensor, nn
from ember.module import Module
from ember.onnx.export import (
    ExportError,
    ExportFileError,
    UnsupportedExportError,
    export,
)

DEVICE = ember.device("ndarray")


def rand(*shape: int) -> Tensor:
    return Tensor.from_data(np.random.default_rng(0).standard_normal(shape).astype(np.float32),
                            DEVICE)  # fmt: skip


class CumProd(Module):
    """A layer whose forward runs an op without an ONNX form (a cumulative product)."""

    def forward(self, x: Tensor) -> Tensor:
        return x.cumprod(1)


class Block(Module):
    linear: nn.Linear
    odd: CumProd

    def forward(self, x: Tensor) -> Tensor:
        return self.odd(self.linear(x))


class Net(Module):
    blocks: list[Block]

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def net() -> Net:
    return Net([Block(nn.LinearConfig(3, 3).init(DEVICE), CumProd()) for _ in range(2)])


def test_an_op_without_an_onnx_form_names_the_op_and_the_module_path(tmp_path):
    path = tmp_path / "net.onnx"
    with pytest.raises(UnsupportedExportError) as error:
        export(net(), rand(2, 3), path)
    message = str(error.value)
    assert "'cumprod'" in message and "float_cumprod" in message
    assert "'blocks.0.odd'" in message
    assert error.value.op == "cumprod" and error.value.module_path == "blocks.0.odd"
    assert "no cumulative product" in error.value.reason
    assert isinstance(error.value, EmberError) and isinstance(error.value, NotImplementedError)
    assert not path.exists() and os.listdir(tmp_path) == []


def test_an_op_whose_form_needs_a_later_opset_says_which():
    class Bits(Module):
        def forward(self, x: Tensor) -> Tensor:
            return x.bitwise_and(x)

    with pytest.raises(UnsupportedExportError, match="needs opset >= 18"):
        export(Bits(), Tensor.from_data([1, 2, 3], DEVICE), "/nonexistent/never.onnx", opset=17)


def test_an_unused_op_without_a_form_does_not_stop_the_export(tmp_path):
    class Unused(Module):
        def forward(self, x: Tensor) -> Tensor:
            x.cumprod(0)  # computed, never used
            return x * 2.0

    assert export(Unused(), rand(2, 3), tmp_path / "u.onnx").is_file()


class Branchy(Module):
    def forward(self, x: Tensor) -> Tensor:
        if x.sum().item() > 0:  # a branch on data
            return x * 2.0
        return x.exp()


def test_a_branch_on_input_values_is_refused(tmp_path):
    x = Tensor.from_data(np.ones((2, 3), np.float32), DEVICE)
    with pytest.raises(ExportError, match="branches on the values of its inputs"):
        export(Branchy(), x, tmp_path / "b.onnx")
    assert not (tmp_path / "b.onnx").exists()


def test_a_check_that_reads_input_values_is_allowed(tmp_path):
    """An embedding checks its ids are in range by reading them: the same ops run for
    other ids, so the export goes through."""
    embedding = nn.EmbeddingConfig(5, 2).init(DEVICE)
    assert export(embedding, Tensor.from_data([[1, 4]], DEVICE), tmp_path / "e.onnx").is_file()


def test_a_forward_that_runs_other_ops_at_another_dynamic_size_is_refused(tmp_path):
    """A Python loop over a dynamic dim unrolls: its length cannot be dynamic."""

    class Loop(Module):
        def forward(self, x: Tensor) -> Tensor:
            total = x[:, 0]
            for t in range(1, x.shape[1]):
                total = total + x[:, t]
            return total

    with pytest.raises(ExportError, match=r"ops at the traced sizes and \d+ at others"):
        export(Loop(), rand(2, 4, 3), tmp_path / "l.onnx",
               dynamic_axes={"input": {0: "batch", 1: "seq"}})  # fmt: skip


def test_a_size_that_is_no_formula_of_the_dynamic_dims_is_refused(tmp_path):
    class Square(Module):
        def forward(self, x: Tensor) -> Tensor:
            n = x.shape[0]
            return x.reshape([-1]).expand([n * n, x.num_elements()]).reshape([n * n, n, -1])

    with pytest.raises(ExportError, match="changes with the dynamic axes"):
        export(Square(), rand(2, 3), tmp_path / "s.onnx", dynamic_axes={"input": {0: "n"}})


@pytest.mark.parametrize(("options", "match"), [
    ({"opset": 12}, "opset 12 is not between"),
    ({"opset": 10_000}, "opset 10000 is not between"),
    ({"dynamic_axes": {"images": {0: "batch"}}}, "not input or output names"),
    ({"dynamic_axes": {"input": {5: "batch"}}}, "dynamic axis 5 of input 'input'"),
    ({"input_names": ["a", "b"]}, "1 distinct non-empty input names"),
    ({"output_names": [""]}, "1 distinct non-empty output names"),
    ({"input_names": ["weight"]}, "both a parameter and an input"),
    ({"input_names": ["x"], "output_names": ["x"]}, "both an input and an output"),
    ({"dynamic_axes": {"input": {0: 3}}}, "needs a name"),
])  # fmt: skip
def test_bad_arguments_are_typed_errors(options, match, tmp_path):
    with pytest.raises(ExportError, match=match):
        export(nn.LinearConfig(3, 2).init(DEVICE), rand(2, 3), tmp_path / "m.onnx", **options)
    assert os.listdir(tmp_path) == []


def test_without_the_onnx_package_export_says_how_to_install_it(tmp_path, monkeypatch):
    import sys

    from ember.backend.errors import BackendUnavailableError

    monkeypatch.setitem(sys.modules, "onnx", None)  # what an absent package looks like
    with pytest.raises(BackendUnavailableError, match="pip install 'ember\\[onnx\\]'"):
        export(nn.Relu(), rand(2), tmp_path / "m.onnx")
    assert os.listdir(tmp_path) == []


def test_example_inputs_without_a_tensor_are_refused(tmp_path):
    with pytest.raises(ExportError, match="holds no tensor"):
        export(nn.Relu(), [3], tmp_path / "m.onnx")


def test_a_forward_returning_no_tensor_is_refused(tmp_path):
    class Text(Module):
        def forward(self, x: Tensor) -> str:
            return "no"

    with pytest.raises(ExportError, match="must return a tensor"):
        export(Text(), rand(1), tmp_path / "m.onnx")


def test_a_missing_folder_is_a_typed_error(tmp_path):
    path = tmp_path / "missing" / "m.onnx"
    with pytest.raises(ExportFileError, match="cannot write") as error:
        export(nn.Relu(), rand(2), path)
    assert isinstance(error.value, OSError) and isinstance(error.value, EmberError)
    assert not path.parent.exists()


def test_a_directory_in_the_way_is_a_typed_error(tmp_path):
    with pytest.raises(ExportFileError, match="is a directory"):
        export(nn.Relu(), rand(2), tmp_path)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a non-root POSIX user")
def test_an_unwritable_folder_is_a_typed_error_and_leaves_nothing(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(ExportFileError, match="cannot write"):
            export(nn.Relu(), rand(2), folder / "m.onnx")
        assert os.listdir(folder) == []
    finally:
        folder.chmod(0o700)


def test_a_permission_error_is_a_typed_error(tmp_path, monkeypatch):
    """What an unwritable folder gives a non-root user (root writes anywhere)."""

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(ExportFileError, match="Permission denied"):
        export(nn.Relu(), rand(2), tmp_path / "m.onnx")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


def test_a_failed_export_leaves_an_existing_file_as_it_was(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"previous")
    with pytest.raises(UnsupportedExportError):
        export(net(), rand(2, 3), path)
    assert path.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == ["m.onnx"]


def test_a_write_that_fails_midway_leaves_no_partial_file(tmp_path, monkeypatch):
    """The bytes go to a temporary that is removed when the write fails."""
    path = tmp_path / "m.onnx"

    def failing_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(ExportFileError, match="No space left"):
        export(nn.Relu(), rand(2), path)
    assert os.listdir(tmp_path) == []
