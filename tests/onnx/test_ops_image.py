"""ImageDecoder on hand-built models: a constant image decoded at import, channel orders
checked against the pixels a lossless PNG was made from, and the errors (bad bytes, an
unknown pixel format, Pillow missing)."""

from __future__ import annotations

import importlib.util
import io
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
Image = pytest.importorskip("PIL.Image", reason="ImageDecoder needs Pillow")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import ember  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.backend.errors import ArgumentError, UnsupportedError  # noqa: E402
from ember.onnx.importer import convert  # noqa: E402
from ember.onnx.ops.image import decode_image  # noqa: E402
from ember.onnx.registry import UnsupportedOnnxError  # noqa: E402

U8 = TensorProto.UINT8
PIXELS = np.random.default_rng(3).integers(0, 256, (5, 7, 3), dtype=np.uint8)


def _png(pixels: np.ndarray, mode: str) -> np.ndarray:
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode).save(buffer, format="PNG")
    return np.frombuffer(buffer.getvalue(), np.uint8)


def _model(pixel_format: str, constant: np.ndarray | None = None, channels: int = 3):
    node = helper.make_node("ImageDecoder", ["data"], ["y"], pixel_format=pixel_format)
    inputs = [] if constant is not None else [helper.make_tensor_value_info("data", U8, [None])]
    init = [] if constant is None else [numpy_helper.from_array(constant, "data")]
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("y", U8, [None, None, channels])],
                              initializer=init)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _run(model, *inputs):
    device = ember.device("ndarray")
    conversion = convert(model)
    out = conversion.build(device)(*(Tensor.from_data(x, device) for x in inputs))
    return conversion.source, out.to_numpy()


@pytest.mark.parametrize(("fmt", "expected"), [("RGB", PIXELS), ("BGR", PIXELS[:, :, ::-1])])
def test_runtime_bytes_decode_in_the_asked_channel_order(fmt, expected):
    source, y = _run(_model(fmt), _png(PIXELS, "RGB"))
    assert "to_numpy()" in source  # decoded when the model runs, not at import
    assert y.dtype == np.uint8
    np.testing.assert_array_equal(y, expected)


def test_constant_image_is_decoded_at_import():
    gray = PIXELS[:, :, 0]
    source, y = _run(_model("Grayscale", _png(gray, "L"), channels=1))
    assert "decode_image" not in source
    np.testing.assert_array_equal(y, gray[:, :, None])


def test_rgba_and_gray_images_become_three_channels():
    rgba = np.concatenate([PIXELS, np.full((5, 7, 1), 9, np.uint8)], axis=2)
    np.testing.assert_array_equal(decode_image(_png(rgba, "RGBA"), "RGB"), PIXELS)
    gray = PIXELS[:, :, 1]
    np.testing.assert_array_equal(decode_image(_png(gray, "L"), "BGR"),
                                  np.repeat(gray[:, :, None], 3, axis=2))


def test_bytes_that_are_no_image_raise_argument_error():
    with pytest.raises(ArgumentError, match="ImageDecoder: the bytes are not an image"):
        _run(_model("RGB"), np.arange(40, dtype=np.uint8))


def test_unknown_pixel_format_is_unsupported():
    with pytest.raises(UnsupportedOnnxError, match="pixel_format 'CMYK'"):
        convert(_model("CMYK"))
    with pytest.raises(ArgumentError, match="pixel_format must be one of"):
        decode_image(_png(PIXELS, "RGB"), "CMYK")


def test_missing_pillow_is_reported(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "PIL" else find_spec(name, *args))
    with pytest.raises(UnsupportedOnnxError, match="needs Pillow"):
        convert(_model("RGB"))
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(UnsupportedError, match="ImageDecoder needs Pillow"):
        decode_image(np.zeros(4, np.uint8))
