"""One export test per primitive of the op table, generated from the table.

Each primitive of the built-in table either exports (its sample call, alone in a module, runs in onnxruntime
and equals ember) or is listed by the exporter registry as having no ONNX form (export
raises the typed error). A primitive added to the table without an exporter, a listing
or a sample here fails ``test_every_primitive_is_exported_or_listed``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX export needs the onnx package (ember[onnx])")
pytest.importorskip("onnxruntime")

from export_helpers import as_list, assert_close, run_onnxruntime

import ember
from ember.backend import custom_op
from ember.backend.ops import OPS, primitives
from ember.backend.options import (
    ConvOptions,
    ConvTransposeOptions,
    InterpolateOptions,
    PadOptions,
    PoolOptions,
    QuantOptions,
)
from ember.module import Module
from ember.onnx.export import UnsupportedExportError, export
from ember.onnx.export.registry import WITHOUT_FORM, WITHOUT_FORM_BY_KIND, rule_for
from ember.tensor import Tensor
from ember.tensor.data import TensorData
from ember.tensor.dtype import DType, Kind

DEVICE = ember.device("ndarray")
F, I, B = Kind.FLOAT, Kind.INT, Kind.BOOL  # noqa: E741
A = (2, 3, 4)
NEWEST_OPSET = 21


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def values(kind: Kind, shape=A, seed: int = 0, domain: str = "any") -> Tensor:
    """Sample values: floats (normal, or in ``domain``), non-zero ints in [-5, 5], bools."""
    rng = _rng(seed)
    if kind is B:
        return Tensor.from_data(rng.random(shape) < 0.5, DEVICE)
    if kind is I:
        low = {"small": 0, "index": 0, "bit": 0}.get(domain, -5)
        high = {"small": 3, "index": 3, "bit": 1}.get(domain, 5)
        data = rng.integers(low, high + 1, shape)
        if domain == "any":
            data[data == 0] = 1
        return Tensor.from_data(data.astype(np.int64), DEVICE)
    if domain == "positive":
        data = rng.uniform(0.5, 2.0, shape)
    elif domain == "unit":
        data = rng.uniform(-0.9, 0.9, shape)
    elif domain == "near_one":
        data = rng.uniform(0.7, 1.3, shape)
    elif domain == "bit":
        data = rng.integers(0, 2, shape)
    else:
        data = rng.standard_normal(shape) * 2.0
    return Tensor.from_data(data.astype(np.float32), DEVICE)


def ints(data) -> Tensor:
    return Tensor.from_data(np.asarray(data, dtype=np.int64), DEVICE)


def typed(data, dtype: str) -> Tensor:
    return Tensor.from_data(np.asarray(data), DEVICE, dtype=dtype)


@dataclass
class Sample:
    """A call of one primitive: its tensor operands (None: an absent optional one), its
    attributes as a function of the (traced) device, and how to compare."""

    operands: list[Tensor | None]
    attrs: Callable[[Any], tuple] = lambda device: ()
    as_list: bool = False  # the operands go in as one list (cat)
    values_compared: bool = True  # False: only shapes (empty)


def _scalar(kind: Kind) -> Any:
    return {F: 1.5, I: 2, B: True}[kind]


UNARY_DOMAIN = {"log": "positive", "sqrt": "positive", "rsqrt": "positive",
                "log1p": "positive", "recip": "positive", "asin": "unit", "acos": "unit",
                "atanh": "unit"}  # fmt: skip

CONV2 = ConvOptions((1, 2), (1, 0), (1, 1), 1)


def sample(name: str, kind: Kind) -> Sample | None:
    """The sample call of op ``name`` for ``kind`` tensors, or None when there is none."""
    op = OPS[name]
    x = values(kind)
    if op.group == "binary":
        if name == "pow":
            return Sample([values(kind, domain="positive" if kind is F else "small"),
                           values(kind, (3, 4), 1, "small")])  # fmt: skip
        if "shift" in name:  # negative values too: a right shift rounds down
            return Sample([x, values(kind, (3, 4), 1, "small")])
        if name.startswith("bitwise"):
            return Sample([values(kind, domain="small"), values(kind, (3, 4), 1, "small")])
        return Sample([x, values(kind, (3, 4), seed=1)])  # broadcasting too
    if op.group == "scalar":
        if name == "clamp":
            bounds = (-0.5, 0.5) if kind is F else (-2, 2)
            return Sample([x], lambda d: bounds)
        if name == "pow_scalar":
            base = values(kind, domain="positive" if kind is F else "small")
            return Sample([base], lambda d: (2.5 if kind is F else 2,))
        if name == "bitwise_and_scalar":  # a low-bit mask: exported before opset 18 too
            return Sample([x], lambda d: (3,))
        if name.startswith("bitwise"):
            return Sample([x if "shift" in name else values(kind, domain="small")],
                          lambda d: (2,))
        return Sample([x], lambda d: (_scalar(kind),))
    if op.group == "unary":
        if name in ("is_nan", "is_inf"):
            data = x.to_numpy().copy()
            data[0, 0, :3] = [np.nan, np.inf, -np.inf]
            return Sample([Tensor.from_data(data, DEVICE)])
        if name == "round":
            return Sample([values(F, domain="any") * 3.0])
        return Sample([values(kind, domain=UNARY_DOMAIN.get(name, "any"))])
    if op.group == "compare":
        other = Tensor.from_data(np.where(_rng(3).random(A) < 0.5, x.to_numpy(),
                                          values(kind, seed=4).to_numpy()), DEVICE)  # fmt: skip
        if name.endswith("_elem"):
            return Sample([values(kind, domain="small")], lambda d: ({F: 0.0, I: 1, B: True}[kind],))
        return Sample([x, other])
    if op.group == "select":
        mask = values(B, seed=5)
        if name == "mask_where":
            return Sample([x, mask, values(kind, seed=6)])
        return Sample([x, mask], lambda d: (_scalar(kind),))
    if op.group == "reduce":
        if name in ("any", "all", "any_dim", "all_dim"):
            data = values(kind, domain="bit") if kind is not B else values(B)
            return Sample([data], (lambda d: (1,)) if name.endswith("_dim") else (lambda d: ()))
        if name in ("var", "var_mean"):
            return Sample([x], lambda d: (1, 1))
        data = values(kind, domain="near_one") if name.startswith("prod") and kind is F else x
        if name.startswith("prod") and kind is I:
            data = values(I, domain="small")
        return Sample([data], (lambda d: (2,)) if op.attrs else (lambda d: ()))
    if op.group == "scan":
        return Sample([x], lambda d: (1,))
    if op.group == "sort":
        distinct = ints(_rng(7).permutation(24).reshape(A)) if kind is I else x
        return Sample([distinct], lambda d: (2, name != "argsort"))
    return _other(name, kind, x)


def _other(name: str, kind: Kind, x: Tensor) -> Sample | None:
    layouts: dict[str, Sample] = {
        "reshape": Sample([x], lambda d: ((6, 4),)),
        "permute": Sample([x], lambda d: ((2, 0, 1),)),
        "expand": Sample([values(kind, (3, 1))], lambda d: ((2, 3, 4),)),
        "flip": Sample([x], lambda d: ((0, 2),)),
        "slice": Sample([x], lambda d: (((0, 2, 1), (1, 3, 1), (0, 4, 2)),)),
        "slice_assign": Sample([x, values(kind, (1, 2, 4), 1)], lambda d: (((0, 1, 1), (1, 3, 1)),)),
        "cat": Sample([x, values(kind, (2, 1, 4), 1)], lambda d: (1,), as_list=True),
        "repeat_dim": Sample([x], lambda d: (1, 2)),
        "argwhere": Sample([x]),
        "gather": Sample([x, values(I, (2, 3, 2), 8, "index")], lambda d: (2,)),
        "scatter_add": Sample([x, values(I, (2, 3, 2), 8, "index"), values(kind, (2, 3, 2), 9)],
                              lambda d: (2,)),
        "select": Sample([x, ints([2, 0, 2])], lambda d: (1,)),
        "select_assign": Sample([x, ints([2, 0]), values(kind, (2, 2, 4), 1)], lambda d: (1,)),
        "matmul": Sample([x, values(kind, (2, 4, 5), 1)]),
        "pad": Sample([x], lambda d: (PadOptions(((1, 2), (0, 1)), "constant",
                                                 {F: 0.5, I: 2, B: 1}[kind]),)),
        "from_data": Sample([x], lambda d: (TensorData(values(kind, (2, 2), 3).to_numpy()), d)),
        "full": Sample([x], lambda d: ((2, 3), _scalar(kind), d,
                                       {F: DType.F32, I: DType.I64, B: DType.BOOL}[kind])),
        "empty": Sample([x], lambda d: ((2, 3), d, {F: DType.F32, I: DType.I64, B: DType.BOOL}[kind]),
                        values_compared=False),
        "random": Sample([x], lambda d: ((2, 3), ember.Distribution.default(), d,
                                         {F: DType.F32, I: DType.I64}[kind])),
        "arange": Sample([x], lambda d: (1, 9, 2, d, DType.I64)),
        "to_device": Sample([x], lambda d: (d,)),
        "cast": Sample([x], lambda d: ({F: DType.I64, I: DType.F32, B: DType.F32}[kind],)),
    }
    for creation in ("zeros", "ones"):
        layouts[creation] = Sample([x], lambda d: ((2, 3), d, {F: DType.F32, I: DType.I64,
                                                               B: DType.BOOL}[kind]))  # fmt: skip
    if name in layouts:
        return layouts[name]
    op = OPS[name]
    if op.group == "activation":
        attrs = {"leaky_relu": (0.1,), "elu": (0.8,), "celu": (1.3,), "softplus": (2.0, 1.0),
                 "softmax": (1,), "log_softmax": (1,), "softmin": (1,), "quiet_softmax": (1,),
                 "glu": (2,)}.get(name, ())  # fmt: skip
        if name == "prelu":
            return Sample([x, values(F, (3,), 1)])
        if name == "leaky_relu_backward":  # (input, gradient): exported as its primitives
            return Sample([x, values(F, A, 1)], lambda d: (0.1,))
        return Sample([x], lambda d: attrs)
    return _module_op(name, kind)


def _module_op(name: str, kind: Kind) -> Sample | None:
    x4, x3 = values(F, (2, 3, 6, 6)), values(F, (2, 3, 8))
    pool1 = PoolOptions((3,), (2,), (1,), (1,), True)
    pool2 = PoolOptions((3, 3), (2, 2), (1, 1), (1, 1), False, False)
    int8 = np.int8
    cases: dict[str, Sample] = {
        "conv1d": Sample([x3, values(F, (4, 3, 3), 1), values(F, (4,), 2)],
                         lambda d: (ConvOptions((2,), (1,), (1,), 1),)),
        "conv2d": Sample([x4, values(F, (4, 3, 3, 3), 1), values(F, (4,), 2)], lambda d: (CONV2,)),
        "conv3d": Sample([values(F, (1, 2, 4, 4, 4)), values(F, (3, 2, 2, 2, 2), 1), None],
                         lambda d: (ConvOptions((1, 1, 1), (0, 0, 0), (1, 1, 1), 1),)),
        "conv_transpose1d": Sample([values(F, (2, 3, 5)), values(F, (3, 2, 3), 1),
                                    values(F, (2,), 2)],
                                   lambda d: (ConvTransposeOptions((2,), (1,), (1,), (1,), 1),)),
        "conv_transpose2d": Sample([values(F, (2, 3, 4, 4)), values(F, (3, 2, 3, 3), 1),
                                    values(F, (2,), 2)],
                                   lambda d: (ConvTransposeOptions((2, 2), (1, 1), (1, 0), (1, 1), 1),)),
        "conv_transpose3d": Sample([values(F, (1, 2, 3, 3, 3)), values(F, (2, 2, 2, 2, 2), 1), None],
                                   lambda d: (ConvTransposeOptions((2, 2, 2), (0, 0, 0), (0, 0, 0),
                                                                   (1, 1, 1), 1),)),
        "conv_x_backward": Sample([x4, values(F, (4, 3, 3, 3), 1), values(F, (2, 4, 4, 4), 2)],
                                  lambda d: (ConvOptions((1, 1), (0, 0), (1, 1), 1),)),
        "conv_weight_backward": Sample([x4, values(F, (4, 3, 3, 3), 1), values(F, (2, 4, 4, 4), 2)],
                                       lambda d: (ConvOptions((1, 1), (0, 0), (1, 1), 1),)),
        "conv_transpose_x_backward": Sample(
            [values(F, (2, 3, 4, 4)), values(F, (3, 2, 3, 3), 1), values(F, (2, 2, 6, 6), 2)],
            lambda d: (ConvTransposeOptions((1, 1), (0, 0), (0, 0), (1, 1), 1),)),
        "conv_transpose_weight_backward": Sample(
            [values(F, (2, 3, 4, 4)), values(F, (3, 2, 3, 3), 1), values(F, (2, 2, 6, 6), 2)],
            lambda d: (ConvTransposeOptions((1, 1), (0, 0), (0, 0), (1, 1), 1),)),
        "avg_pool1d": Sample([x3], lambda d: (PoolOptions((2,), (2,), (0,), (1,)),)),
        "avg_pool2d": Sample([x4], lambda d: (pool2,)),
        "max_pool1d": Sample([x3], lambda d: (pool1,)),
        "max_pool2d": Sample([x4], lambda d: (PoolOptions((2, 2), (2, 2), (0, 0), (1, 1)),)),
        "max_pool1d_with_indices": Sample([x3], lambda d: (pool1,)),
        "max_pool2d_with_indices": Sample([x4], lambda d: (pool2,)),
        "adaptive_avg_pool1d": Sample([values(F, (2, 3, 7))], lambda d: ((3,),)),
        "adaptive_avg_pool2d": Sample([values(F, (2, 3, 7, 5))], lambda d: ((3, 2),)),
        "adaptive_max_pool1d": Sample([x3], lambda d: ((4,),)),
        "adaptive_max_pool2d": Sample([values(F, (2, 3, 6, 4))], lambda d: ((3, 2),)),
        "avg_pool2d_backward": Sample([x4, values(F, (2, 3, 3, 3), 1)], lambda d: (pool2,)),
        "adaptive_avg_pool2d_backward": Sample([x4, values(F, (2, 3, 3, 3), 1)]),
        "max_pool2d_with_indices_backward": None,
        "embedding": Sample([values(F, (10, 4)), ints([[1, 2, 9], [0, 0, 5]])]),
        "embedding_backward": Sample([values(F, (10, 4)), values(F, (2, 3, 4), 1),
                                      ints([[1, 2, 9], [0, 0, 5]])]),
        "interpolate": Sample([values(F, (2, 3, 4, 5))],
                              lambda d: ((7, 9), InterpolateOptions("bilinear", False))),
        "interpolate_backward": Sample([values(F, (2, 3, 4, 5)), values(F, (2, 3, 7, 9), 1)],
                                       lambda d: ((7, 9), InterpolateOptions("bilinear", False))),
        "layer_norm": Sample([x3, values(F, (8,), 1), values(F, (8,), 2)], lambda d: (1e-5,)),
        "unfold4d": Sample([values(F, (2, 3, 5, 5))],
                           lambda d: ((2, 2), ConvOptions((1, 1), (0, 0), (1, 1), 1))),
        "dequantize": Sample([typed(_rng(1).integers(-8, 8, (4, 6)).astype(int8), "i8"),
                              values(F, (4,), 2, "positive"), None],
                             lambda d: (QuantOptions(axis=0),)),
        "quantized_linear": Sample([values(F, (2, 6)),
                                    typed(_rng(1).integers(-8, 8, (6, 4)).astype(int8), "i8"),
                                    values(F, (4,), 2, "positive"), None, values(F, (4,), 3)],
                                   lambda d: (QuantOptions(axis=1),)),
        "quantized_conv": Sample([x4, typed(_rng(1).integers(-8, 8, (4, 3, 3, 3)).astype(int8), "i8"),
                                  values(F, (4,), 2, "positive"), None, None],
                                 lambda d: (CONV2, QuantOptions(axis=0))),
        "integer_linear": Sample([typed(_rng(4).integers(-8, 8, (2, 6)).astype(int8), "i8"),
                                  typed(np.float32(0.1), "f32"), None,
                                  typed(_rng(1).integers(-8, 8, (6, 4)).astype(int8), "i8"),
                                  values(F, (4,), 2, "positive"), None, None],
                                 lambda d: (QuantOptions(), QuantOptions(axis=1))),
        "integer_conv": Sample([typed(_rng(4).integers(-8, 8, (2, 3, 6, 6)).astype(int8), "i8"),
                                typed(np.float32(0.1), "f32"), None,
                                typed(_rng(1).integers(-8, 8, (4, 3, 3, 3)).astype(int8), "i8"),
                                values(F, (4,), 2, "positive"), None, None],
                               lambda d: (CONV2, QuantOptions(), QuantOptions(axis=0))),
    }
    return cases.get(name)


class OneOp(Module):
    """A module that runs one primitive on its tensor arguments."""

    primitive: str
    present: tuple[bool, ...]  # which operands are tensors (the others are None)
    attrs: Any
    as_list: bool

    def forward(self, *tensors: Tensor) -> Any:
        device = tensors[0].device
        given = iter(t.into_primitive() for t in tensors)
        operands = [next(given) if here else None for here in self.present]
        if self.as_list:
            operands = [operands]
        out = getattr(device.backend, self.primitive)(*operands, *self.attrs(device))
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(Tensor.from_primitive(o, device) for o in outs)


def _listed(name: str, kind: Kind) -> bool:
    return name in WITHOUT_FORM or (name, kind) in WITHOUT_FORM_BY_KIND


def _opset(name: str, kind: Kind) -> int:
    """17, or the first opset where the op has its own exporter when that is later (the op
    is then tested in its own ONNX form rather than as its primitives)."""
    for opset in range(17, NEWEST_OPSET + 1):
        if rule_for(name, kind, opset) is not None:
            return opset
    return 17


# The built-in table; custom ops (ember.backend.custom_op, e.g. the fused recurrent cells
# ember.nn registers) export through their references: see the test below.
CASES = [(op.name, kind, prim) for op, kind, prim in primitives() if op.group != "custom"]


def test_every_primitive_is_exported_or_listed():
    missing = [prim for name, kind, prim in CASES
               if not _listed(name, kind) and sample(name, kind) is None]  # fmt: skip
    assert not missing, f"primitives with neither a sample here nor a WITHOUT_FORM entry: {missing}"


@pytest.mark.parametrize(("name", "kind", "primitive"), CASES, ids=[c[2] for c in CASES])
def test_a_primitive_exports(name, kind, primitive, tmp_path):
    case = sample(name, kind)
    if case is None:
        assert _listed(name, kind)
        pytest.skip("listed without an ONNX form and no sample call")
    tensors = [t for t in case.operands if t is not None]
    # A creation op takes no tensor: its sample's tensor is only the graph's input.
    present = tuple(t is not None for t in case.operands) if OPS[name].inputs else ()
    module = OneOp(primitive, present, case.attrs, case.as_list)
    path = tmp_path / "op.onnx"
    if _listed(name, kind):
        with pytest.raises(UnsupportedExportError) as error:
            export(module, tensors, path, opset=_opset(name, kind))
        assert not path.exists()
        assert "has no ONNX form" in str(error.value)
        return
    export(module, tensors, path, opset=_opset(name, kind))
    got, want = run_onnxruntime(path, tensors), as_list(module(*tensors))
    if not case.values_compared:
        assert [g.shape for g in got] == [w.shape for w in want]
        return
    assert_close(got, want, f"{primitive} in onnxruntime")


def _scaled_tanh_reference(backend, x, scale):
    return backend.float_mul_scalar(backend.float_tanh(x), scale)


SCALED_TANH = custom_op("export_test_scaled_tanh", ("tensor",), lambda op, x, scale: x,
                        _scaled_tanh_reference, attrs=("scale",))  # fmt: skip


def test_a_custom_op_exports_through_its_reference(tmp_path):
    """A custom op is a composite: the tracer records the primitives of its reference."""

    class Scaled(Module):
        def forward(self, x: Tensor) -> Tensor:
            return SCALED_TANH(x, 3.0)

    x = values(F)
    path = export(Scaled(), x, tmp_path / "custom.onnx")
    assert_close(run_onnxruntime(path, [x]), as_list(Scaled()(x)), "custom op")
    import onnx

    assert [n.op_type for n in onnx.load(str(path)).graph.node] == ["Tanh", "Mul"]


class AndMask(Module):
    mask: int

    def forward(self, x: Tensor) -> Tensor:
        return x.bitwise_and(self.mask)


def test_any_bit_mask_exports_from_opset_18_and_low_bit_masks_before(tmp_path):
    x = values(I)
    for opset, mask in ((18, 6), (17, 7)):
        path = export(AndMask(mask), x, tmp_path / f"and{opset}.onnx", opset=opset)
        assert_close(run_onnxruntime(path, [x]), as_list(AndMask(mask)(x)), f"& {mask}")
    with pytest.raises(UnsupportedExportError, match="only masks 2\\*\\*k - 1"):
        export(AndMask(6), x, tmp_path / "and.onnx", opset=17)
