"""Interpolation (ONNX ``Resize``) and padding (ONNX ``Pad``)."""

from __future__ import annotations

from ember.onnx.export.emitter import Emitter
from ember.onnx.export.registry import exporter
from ember.onnx.export.tracer import OpCall


@exporter("interpolate", since=13)
def interpolate(e: Emitter, call: OpCall) -> None:
    """``nearest`` is PyTorch's legacy nearest (asymmetric coordinates, rounded down);
    ``bilinear`` and ``bicubic`` (a = -0.75) use PyTorch's half-pixel or aligned corners."""
    options = e.static(call, "options")
    aval = call.input_avals[0]
    assert aval is not None
    out_size = list(e.static(call, "output_size"))
    other = e.alternate_input_shape(call, 0)
    sizes = e.sizes(call, [*aval.shape[:2], *out_size], [*other[:2], *out_size])
    if options.mode == "nearest":
        attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                 "nearest_mode": "floor"}  # fmt: skip
    else:
        corners = "align_corners" if options.align_corners else "pytorch_half_pixel"
        attrs = {"mode": "linear" if options.mode == "bilinear" else "cubic",
                 "coordinate_transformation_mode": corners}  # fmt: skip
        if options.mode == "bicubic":
            attrs["cubic_coeff_a"] = -0.75
    e.node("Resize", [e.input(call, 0), "", "", sizes], [e.output(call)], **attrs)


@exporter("pad")
def pad(e: Emitter, call: OpCall) -> None:
    """ember pads the trailing dims; ONNX takes every dim's begins, then every dim's ends."""
    options = e.static(call, "options")
    aval = call.input_avals[0]
    assert aval is not None
    rank, padded = len(aval.shape), len(options.pads)
    begins = [0] * (rank - padded) + [p[0] for p in options.pads]
    ends = [0] * (rank - padded) + [p[1] for p in options.pads]
    inputs = [e.input(call, 0), e.ints(begins + ends)]
    if options.mode == "constant":
        inputs.append(e.scalar_like(call, options.value))
    e.node("Pad", inputs, [e.output(call)], mode=options.mode)
