"""The op table: the single description of ember's op surface.

Each entry names an op, the tensor kinds it exists for, its tensor operands,
its attributes, its abstract-evaluation rule (``ember.backend.rules``) and its
group. Everything else is derived from here:

* the backend primitives: ``<kind>_<name>`` for each kind (``float_add``,
  ``int_add``), or the bare name for ops that exist on Float only and are not
  prefixed in Burn either (``conv2d``, ``relu``);
* the methods a backend must implement (primitives) or may override
  (composites, which :class:`ember.backend.Backend` implements from primitives);
* what the Tensor layer validates, and what a decorator (autodiff, fusion)
  intercepts through its one generic path.

Adding an op means: an entry here, its primitive in each base backend (or a
composite default on ``Backend``), its backward rule, and its conformance tests.

Call convention of every primitive: tensor operands first, in the order of
``inputs``, then the attributes in the order of ``attrs``. An input named
``"*tensors"`` is a list of tensors; a name ending in ``?`` may be ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ember.backend import rules
from ember.tensor.dtype import Kind

F, I, B = Kind.FLOAT, Kind.INT, Kind.BOOL  # noqa: E741
FLOAT = frozenset({F})
NUMERIC = frozenset({F, I})
ALL = frozenset({F, I, B})


@dataclass(frozen=True, eq=False)
class OpDef:
    """One op of the table. See the module docstring for the meaning of each field."""

    name: str
    kinds: frozenset[Kind]
    inputs: tuple[str, ...]
    attrs: tuple[str, ...]
    rule: Any
    group: str
    composite: bool = False
    prefixed: bool = True

    def primitive(self, kind: Kind) -> str:
        """The backend method name of this op for tensors of ``kind``."""
        return f"{kind.prefix}_{self.name}" if self.prefixed else self.name

    def primitive_names(self) -> list[tuple[Kind, str]]:
        return [(k, self.primitive(k)) for k in (F, I, B) if k in self.kinds]

    def __repr__(self) -> str:
        return f"OpDef({self.name})"


OPS: dict[str, OpDef] = {}


def _op(name, kinds, inputs, attrs, rule, group, *, composite=False, prefixed=True) -> None:
    if name in OPS:
        raise RuntimeError(f"op {name!r} declared twice")
    OPS[name] = OpDef(name, frozenset(kinds), tuple(inputs), tuple(attrs), rule, group,
                      composite, prefixed)  # fmt: skip


X, AB = ("tensor",), ("lhs", "rhs")
r = rules

# --- creation and data movement ------------------------------------------------------
_op("from_data", ALL, (), ("data", "device"), None, "creation")
_op("into_data", ALL, X, (), None, "data")
_op("to_device", ALL, X, ("device",), r.same, "data")
_op("empty", ALL, (), ("shape", "device", "dtype"), r.creation, "creation")
_op("full", ALL, (), ("shape", "value", "device", "dtype"), r.creation, "creation")
_op("zeros", ALL, (), ("shape", "device", "dtype"), r.creation, "creation", composite=True)
_op("ones", ALL, (), ("shape", "device", "dtype"), r.creation, "creation", composite=True)
_op("random", NUMERIC, (), ("shape", "distribution", "device", "dtype"), r.creation, "creation")
_op("arange", {I}, (), ("start", "end", "step", "device", "dtype"), r.arange, "creation")
_op("cast", ALL, X, ("dtype",), r.cast, "data")

# --- element-wise arithmetic -----------------------------------------------------------
for _name in ("add", "sub", "mul", "div", "remainder", "pow", "max_pair", "min_pair"):
    _op(_name, NUMERIC, AB, (), r.binary, "binary")
    _op(f"{_name}_scalar", NUMERIC, X, ("scalar",), r.same, "scalar")
_op("atan2", FLOAT, AB, (), r.binary, "binary")
_op("clamp", NUMERIC, X, ("min", "max"), r.clamp, "scalar")
for _name in ("neg", "abs", "sign"):
    _op(_name, NUMERIC, X, (), r.same, "unary")
for _name in ("exp", "log", "log1p", "expm1", "erf", "sqrt", "rsqrt", "recip", "sin", "cos",
              "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan", "round", "floor", "ceil",
              "trunc"):  # fmt: skip
    _op(_name, FLOAT, X, (), r.same, "unary")
for _name in ("is_nan", "is_inf"):
    _op(_name, FLOAT, X, (), r.to_bool, "unary")

# --- bitwise and logical -----------------------------------------------------------------
for _name in ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
              "bitwise_right_shift"):  # fmt: skip
    _op(_name, {I}, AB, (), r.binary, "binary")
    _op(f"{_name}_scalar", {I}, X, ("scalar",), r.same, "scalar")
_op("bitwise_not", {I}, X, (), r.same, "unary")
for _name in ("and", "or", "xor"):
    _op(_name, {B}, AB, (), r.binary, "binary")
_op("not", {B}, X, (), r.same, "unary")

# --- comparisons (Bool output) -------------------------------------------------------------
for _name, _kinds in (("equal", ALL), ("not_equal", ALL), ("greater", NUMERIC),
                      ("greater_equal", NUMERIC), ("lower", NUMERIC), ("lower_equal", NUMERIC)):  # fmt: skip
    _op(_name, _kinds, AB, (), r.compare, "compare")
    _op(f"{_name}_elem", _kinds, X, ("scalar",), r.to_bool, "compare")

# --- selection by mask -----------------------------------------------------------------------
_op("mask_where", ALL, ("tensor", "mask", "value"), (), r.mask_where, "select")
_op("mask_fill", ALL, ("tensor", "mask"), ("value",), r.mask_fill, "select")

# --- reductions ------------------------------------------------------------------------------
for _name in ("sum", "prod", "mean"):
    _op(_name, NUMERIC, X, (), r.reduce_all, "reduce")
    _op(f"{_name}_dim", NUMERIC, X, ("dim",), r.reduce_dim, "reduce")
for _name in ("max", "min"):
    _op(_name, NUMERIC, X, (), r.reduce_nonempty, "reduce")
    _op(f"{_name}_dim", NUMERIC, X, ("dim",), r.reduce_dim_nonempty, "reduce")
    _op(f"{_name}_dim_with_indices", NUMERIC, X, ("dim",), r.reduce_dim_with_indices, "reduce",
        composite=True)  # fmt: skip
for _name in ("argmax", "argmin"):
    _op(_name, NUMERIC, X, ("dim",), r.reduce_dim_index, "reduce")
for _name in ("any", "all"):
    _op(_name, ALL, X, (), r.reduce_all_bool, "reduce")
    _op(f"{_name}_dim", ALL, X, ("dim",), r.reduce_dim_bool, "reduce")
_op("cumsum", NUMERIC, X, ("dim",), r.scan, "scan")
_op("cumprod", NUMERIC, X, ("dim",), r.scan, "scan")
_op("sort", NUMERIC, X, ("dim", "descending"), r.sort, "sort", composite=True)
_op("argsort", NUMERIC, X, ("dim", "descending"), r.argsort, "sort", composite=True)
_op("sort_with_indices", NUMERIC, X, ("dim", "descending"), r.sort_with_indices, "sort")
_op("var", FLOAT, X, ("dim", "correction"), r.var, "reduce", composite=True)
_op("var_mean", FLOAT, X, ("dim", "correction"), r.var_mean, "reduce", composite=True)

# --- layout -------------------------------------------------------------------------------------
_op("reshape", ALL, X, ("shape",), r.reshape, "layout")
_op("permute", ALL, X, ("axes",), r.permute, "layout")
_op("expand", ALL, X, ("shape",), r.expand, "layout")
_op("flip", ALL, X, ("axes",), r.flip, "layout")
_op("slice", ALL, X, ("ranges",), r.slice_, "layout")
_op("slice_assign", ALL, ("tensor", "values"), ("ranges",), r.slice_assign, "layout")
_op("cat", ALL, ("*tensors",), ("dim",), r.cat, "layout")
_op("repeat_dim", ALL, X, ("dim", "times"), r.repeat_dim, "layout")
_op("argwhere", {B}, X, (), r.argwhere, "layout")

# --- indexing -------------------------------------------------------------------------------------
_op("gather", ALL, ("tensor", "indices"), ("dim",), r.gather, "index")
_op("scatter_add", NUMERIC, ("tensor", "indices", "values"), ("dim",), r.scatter_add, "index")
_op("select", ALL, ("tensor", "indices"), ("dim",), r.select, "index")
_op("select_assign", NUMERIC, ("tensor", "indices", "values"), ("dim",), r.select_assign, "index")

# --- linear algebra ---------------------------------------------------------------------------------
_op("matmul", NUMERIC, AB, (), r.matmul, "matmul")

# --- activations (Float only; composites a backend may override) -----------------------------------
for _name in ("relu", "relu6", "sigmoid", "log_sigmoid", "hard_sigmoid", "silu", "mish", "gelu",
              "gelu_tanh", "selu", "hard_swish"):  # fmt: skip
    _op(_name, FLOAT, X, (), r.same, "activation", composite=True, prefixed=False)
_op("leaky_relu", FLOAT, X, ("negative_slope",), r.same, "activation", composite=True, prefixed=False)
# Its gradient (as PyTorch's): ``grad`` where ``tensor > 0``, ``grad * negative_slope``
# elsewhere. Linear in ``grad``, so its own rule is itself: gradients of gradients through
# a leaky ReLU stay one op per order instead of a select, its mask and its rule's selects.
_op("leaky_relu_backward", FLOAT, ("tensor", "grad"), ("negative_slope",), r.activation_backward,
    "activation", composite=True, prefixed=False)  # fmt: skip
_op("elu", FLOAT, X, ("alpha",), r.same, "activation", composite=True, prefixed=False)
_op("celu", FLOAT, X, ("alpha",), r.same, "activation", composite=True, prefixed=False)
_op("softplus", FLOAT, X, ("beta", "threshold"), r.same, "activation", composite=True, prefixed=False)
_op("prelu", FLOAT, ("tensor", "alpha"), (), r.prelu, "activation", composite=True, prefixed=False)
for _name in ("softmax", "log_softmax", "softmin", "quiet_softmax"):
    _op(_name, FLOAT, X, ("dim",), r.dim_op, "activation", composite=True, prefixed=False)
_op("glu", FLOAT, X, ("dim",), r.glu, "activation", composite=True, prefixed=False)

# --- normalization (Float only; a composite a backend may override) ----------------------------
# Over the last dim, as PyTorch's layer_norm over one dim: (x - mean) / sqrt(var + epsilon),
# the variance biased, times ``weight`` plus ``bias`` where given.
_op("layer_norm", FLOAT, ("tensor", "weight?", "bias?"), ("epsilon",), r.layer_norm,
    "normalization", composite=True, prefixed=False)  # fmt: skip

# --- module ops (Float only) ---------------------------------------------------------------------------
_CONV = ("tensor", "weight", "bias?")
for _n in (1, 2, 3):
    _op(f"conv{_n}d", FLOAT, _CONV, ("options",), r.conv, "module", composite=_n == 1, prefixed=False)
    _op(f"conv_transpose{_n}d", FLOAT, _CONV, ("options",), r.conv_transpose, "module",
        composite=_n == 1, prefixed=False)  # fmt: skip
# Their gradients (2-d and 3-d, by the weight's rank), as Burn's conv*_x_backward /
# conv*_weight_backward: composites from the convolutions a backend may override.
_CONV_BACKWARD = ("tensor", "weight", "grad")
for _name in ("conv", "conv_transpose"):
    _op(f"{_name}_x_backward", FLOAT, _CONV_BACKWARD, ("options",), r.conv_x_backward, "module",
        composite=True, prefixed=False)  # fmt: skip
    _op(f"{_name}_weight_backward", FLOAT, _CONV_BACKWARD, ("options",), r.conv_weight_backward,
        "module", composite=True, prefixed=False)  # fmt: skip
for _n in (1, 2):
    _c = _n == 1  # the 1-d ops default to their 2-d op with a unit dim
    _op(f"avg_pool{_n}d", FLOAT, X, ("options",), r.pool, "module", composite=_c, prefixed=False)
    _op(f"max_pool{_n}d", FLOAT, X, ("options",), r.pool, "module", composite=True, prefixed=False)
    _op(f"max_pool{_n}d_with_indices", FLOAT, X, ("options",), r.pool_with_indices, "module",
        composite=_c, prefixed=False)  # fmt: skip
    _op(f"adaptive_avg_pool{_n}d", FLOAT, X, ("output_size",), r.adaptive_pool, "module",
        composite=_c, prefixed=False)  # fmt: skip
    _op(f"adaptive_max_pool{_n}d", FLOAT, X, ("output_size",), r.adaptive_pool, "module",
        composite=_c, prefixed=False)  # fmt: skip
_op("avg_pool2d_backward", FLOAT, ("tensor", "grad"), ("options",), r.pool_backward, "module",
    prefixed=False)  # fmt: skip
_op("max_pool2d_with_indices_backward", FLOAT, ("tensor", "grad", "indices"), ("options",),
    r.max_pool_backward, "module", prefixed=False)  # fmt: skip
_op("adaptive_avg_pool2d_backward", FLOAT, ("tensor", "grad"), (), r.adaptive_pool_backward,
    "module", prefixed=False)  # fmt: skip
_op("embedding", FLOAT, ("weights", "indices"), (), r.embedding, "module", prefixed=False)
_op("embedding_backward", FLOAT, ("weights", "grad", "indices"), (), r.embedding_backward,
    "module", prefixed=False)  # fmt: skip
_op("interpolate", FLOAT, X, ("output_size", "options"), r.interpolate, "module", prefixed=False)
_op("interpolate_backward", FLOAT, ("tensor", "grad"), ("output_size", "options"),
    r.interpolate_backward, "module", prefixed=False)  # fmt: skip
_op("pad", ALL, X, ("options",), r.pad, "module")
_op("unfold4d", FLOAT, X, ("kernel_size", "options"), r.unfold4d, "module", composite=True,
    prefixed=False)  # fmt: skip

# --- quantized (ember.quantization) ---------------------------------------------------------------
# Int values with Float scales (and Int zero points) in ``QuantOptions``' layout; the linear's
# default dequantizes, multiplies and adds the bias; a backend may override it with integer
# kernels.
_op("dequantize", {I}, ("values", "scales", "zero_points?"), ("options",), r.dequantize,
    "quantized", composite=True, prefixed=False)  # fmt: skip
_op("quantized_linear", FLOAT, ("tensor", "values", "scales", "zero_points?", "bias?"),
    ("options",), r.quantized_linear, "quantized", composite=True, prefixed=False)  # fmt: skip
_op("quantized_conv", FLOAT, ("tensor", "values", "scales", "zero_points?", "bias?"),
    ("options", "quant"), r.quantized_conv, "quantized", composite=True, prefixed=False)  # fmt: skip
# A quantized input by a quantized weight (static activation quantization, ONNX's integer
# ops): the products are exact in integers; the default dequantizes both and runs in float.
_op("integer_linear", FLOAT, ("values", "scales", "zero_points?", "weight_values",
    "weight_scales", "weight_zero_points?", "bias?"), ("input_quant", "options"),
    r.integer_linear, "quantized", composite=True, prefixed=False)  # fmt: skip
_op("integer_conv", FLOAT, ("values", "scales", "zero_points?", "weight_values",
    "weight_scales", "weight_zero_points?", "bias?"), ("options", "input_quant", "quant"),
    r.integer_conv, "quantized", composite=True, prefixed=False)  # fmt: skip

ops = SimpleNamespace(**OPS)
"""Attribute access to the table: ``ops.add`` is ``OPS["add"]``."""


def primitives() -> list[tuple[OpDef, Kind, str]]:
    """Every (op, kind, method name) a backend has, in table order."""
    return [(op, kind, name) for op in OPS.values() for kind, name in op.primitive_names()]
