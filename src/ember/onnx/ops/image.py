"""Image ops: ImageDecoder (opset 20), which decodes an encoded image with Pillow.

Decoding is host work: the encoded bytes (a 1-d u8 tensor) are read into NumPy, Pillow
decodes them, and the ``[height, width, channels]`` u8 pixels come back as a tensor on
the input's device. A constant input is decoded once at import time. Pillow is an
optional dependency, imported only when a model uses the op.
"""

from __future__ import annotations

import importlib.util
import io

import numpy as np

from ember.backend.errors import ArgumentError, UnsupportedError
from ember.onnx.context import NodeContext
from ember.onnx.registry import converter
from ember.tensor import DType

# Pillow's mode for each pixel format, and whether the channels are reversed after it.
_FORMATS = {"RGB": ("RGB", False), "BGR": ("RGB", True), "Grayscale": ("L", False)}


def decode_image(data: np.ndarray, pixel_format: str = "RGB") -> np.ndarray:
    """Decodes the encoded image ``data`` (u8 bytes) into ``[height, width, channels]`` u8.

    Args:
        data: the encoded file's bytes (any format Pillow reads: JPEG, PNG, BMP, TIFF,
            WebP, JPEG 2000, PNM, ...).
        pixel_format: ``"RGB"``, ``"BGR"`` (3 channels) or ``"Grayscale"`` (1 channel).

    Raises:
        UnsupportedError: Pillow is not installed.
        ArgumentError: an unknown pixel format, or bytes Pillow cannot decode.
    """
    if pixel_format not in _FORMATS:
        raise ArgumentError(f"ImageDecoder: pixel_format must be one of {sorted(_FORMATS)}, "
                            f"got {pixel_format!r}")
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError as error:
        raise UnsupportedError("ImageDecoder needs Pillow: pip install pillow") from error
    mode, reverse = _FORMATS[pixel_format]
    try:
        with Image.open(io.BytesIO(np.asarray(data, dtype=np.uint8).tobytes())) as image:
            pixels = np.asarray(image.convert(mode), dtype=np.uint8)
    except (UnidentifiedImageError, OSError) as error:
        raise ArgumentError(f"ImageDecoder: the bytes are not an image Pillow can decode "
                            f"({error})") from error
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if reverse:
        pixels = pixels[:, :, ::-1]
    return np.ascontiguousarray(pixels)


@converter("ImageDecoder", since=20, attrs=("pixel_format",),
           limits="decoded on the host by Pillow (an optional dependency); no gradient")  # fmt: skip
def image_decoder(node: NodeContext) -> list[str]:
    x = node.input(0)
    fmt = node.attr("pixel_format", "RGB")
    if isinstance(fmt, bytes):
        fmt = fmt.decode()
    if fmt not in _FORMATS:
        node.unsupported(f"pixel_format {fmt!r} is not one of {sorted(_FORMATS)}")
    if importlib.util.find_spec("PIL") is None:
        node.unsupported("decoding images needs Pillow (pip install pillow)")
    if x.dtype not in (None, DType.U8):
        node.unsupported(f"the encoded image must be u8 bytes, not {x.dtype.value}")
    const = x.const
    if const is not None:
        node.set_constant(0, decode_image(const, fmt))
        return []
    decode = node.tmp("decode_image")
    return [
        f"from ember.onnx.ops.image import decode_image as {decode}",
        f'{node.outputs[0]} = Tensor.from_data({decode}({x.expr}.to_numpy(), {fmt!r}), '
        f'{x.expr}.device, "u8")',
    ]
