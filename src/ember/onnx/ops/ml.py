"""Classic machine-learning ops of the ``ai.onnx.ml`` domain: Binarizer,
ArrayFeatureExtractor, LabelEncoder (numeric keys and values), TreeEnsemble (opset 5),
Scaler and LinearRegressor.

Tree ensembles are evaluated with tensor ops, every tree of every sample at once: the
interior nodes and leaves become constant tables (feature, comparison, threshold, next
node on true and on false), each sample starts at every root, and one step of gathers
moves every position one level down. A leaf points at itself, so after as many steps as
the deepest tree has levels every position is on a leaf. Each leaf's contribution is a
row over the targets, so the aggregation is a reduction over the trees.

String tensors (string keys or values of LabelEncoder, string features) have no ember
dtype and are unsupported.
"""

from __future__ import annotations

import numpy as np

from ember.onnx.context import NodeContext, Value, literal
from ember.onnx.ops.math import number
from ember.onnx.registry import converter
from ember.tensor.data import numpy_dtype

_ML = "ai.onnx.ml"
_INDENT = "    "

# TreeEnsemble's node comparison modes (the nodes_modes attribute).
_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)
_COMPARE = {_LEQ: "lower_equal", _LT: "lower", _GTE: "greater_equal", _GT: "greater",
            _EQ: "equal", _NEQ: "not_equal"}  # fmt: skip
_AGGREGATES = {0: "AVERAGE", 1: "SUM", 2: "MIN", 3: "MAX"}
_TRANSFORMS = {0: "NONE", 1: "SOFTMAX", 2: "LOGISTIC", 3: "SOFTMAX_ZERO", 4: "PROBIT"}


def _rank(node: NodeContext, x: Value) -> int:
    if x.rank is None:
        node.unsupported("the input's rank must be known at import time (run ONNX shape "
                         "inference, or give the model's inputs static ranks)")
    return x.rank  # type: ignore[return-value]


def _float_dtype(node: NodeContext, x: Value) -> np.dtype:
    if x.dtype is None:
        node.unsupported("the input's dtype must be known at import time")
    dtype = np.dtype(numpy_dtype(x.dtype))
    if dtype.kind != "f":
        node.unsupported(f"{node.op_type} is supported for float inputs, got {dtype}")
    return dtype


# ------------------------------------------------------------------------------ simple ops
@converter("Binarizer", since=1, domain=_ML, attrs=("threshold",))
def binarizer(node: NodeContext) -> str:
    x = node.input(0)
    threshold = float(node.attr("threshold", 0.0))
    if x.dtype is not None and np.dtype(numpy_dtype(x.dtype)).kind in "iu":
        # x > t on integers is x > floor(t), which keeps the comparison in the Int kind.
        return (f"{node.outputs[0]} = {x.expr}.greater_elem({int(np.floor(threshold))})"
                f".cast({x.expr}.dtype)")
    return f"{node.outputs[0]} = {x.expr}.greater_elem({number(threshold)}).cast({x.expr}.dtype)"


@converter("ArrayFeatureExtractor", since=1, domain=_ML, attrs=())
def array_feature_extractor(node: NodeContext) -> str:
    x, indices = node.input(0), node.input(1)
    rank = _rank(node, x)
    picked = f"{x.expr}.select({rank - 1}, {indices.expr}.reshape([-1]))"
    # A vector input gives a one-row matrix, as onnxruntime does.
    if rank == 1:
        picked += ".reshape([1, -1])"
    return f"{node.outputs[0]} = {picked}"


@converter("Scaler", since=1, domain=_ML, attrs=("offset", "scale"))
def scaler(node: NodeContext) -> str:
    x = node.input(0)
    offset = np.asarray(node.attr("offset", [0.0]), np.float32)
    scale = np.asarray(node.attr("scale", [1.0]), np.float32)
    field_offset = _vector(node, offset, "offset")
    field_scale = _vector(node, scale, "scale")
    return f"{node.outputs[0]} = ({x.expr}.float() - {field_offset}) * {field_scale}"


def _vector(node: NodeContext, value: np.ndarray, hint: str) -> str:
    if value.size == 1:
        return number(float(value[0]))
    return node.param(value, f"{node.name}_{hint}", trainable=False)


@converter("LinearRegressor", since=1, domain=_ML,
           attrs=("coefficients", "intercepts", "post_transform", "targets"))
def linear_regressor(node: NodeContext) -> list[str]:
    x = node.input(0)
    targets = int(node.attr("targets", 1))
    coefficients = np.asarray(node.attr("coefficients", []), np.float32)
    if coefficients.size % targets:
        node.unsupported(f"{coefficients.size} coefficients do not split into {targets} targets")
    weight = coefficients.reshape(targets, -1).T  # [features, targets]
    intercepts = np.asarray(node.attr("intercepts", [0.0] * targets), np.float32)
    h = node.tmp("linear")
    lines = [f"{h} = {x.expr}.float().reshape([-1, {weight.shape[0]}]).matmul("
             f"{node.param(weight, f'{node.name}_coefficients', trainable=False)})"]
    if np.any(intercepts):
        lines.append(f"{h} = {h} + {_vector(node, intercepts, 'intercepts')}")
    lines.append(f"{node.outputs[0]} = {_post_transform(node, h, lines)}")
    return lines


# ------------------------------------------------------------------------------ LabelEncoder
def _label_table(node: NodeContext, what: str) -> np.ndarray | None:
    """The keys or values (``what``) of a LabelEncoder as a numeric array, or None."""
    if f"{what}_strings" in node.attrs:
        node.unsupported(f"string {what} (ember has no string tensors)")
    if f"{what}_int64s" in node.attrs:
        return np.asarray(node.attr(f"{what}_int64s"), np.int64)
    if f"{what}_floats" in node.attrs:
        return np.asarray(node.attr(f"{what}_floats"), np.float32)
    if f"{what}_tensor" in node.attrs:
        table = np.asarray(node.attr(f"{what}_tensor")).reshape(-1)
        if table.dtype.kind not in "iuf":
            node.unsupported(f"{what}_tensor of dtype {table.dtype} (ember has no string tensors)")
        return table
    return None


@converter("LabelEncoder", since=2, domain=_ML,
           attrs=("keys_int64s", "keys_floats", "keys_strings", "keys_tensor", "values_int64s",
                  "values_floats", "values_strings", "values_tensor", "default_int64",
                  "default_float", "default_string", "default_tensor"),
           limits="numeric keys and values only (no strings)")  # fmt: skip
def label_encoder(node: NodeContext) -> list[str]:
    keys, values = _label_table(node, "keys"), _label_table(node, "values")
    if keys is None or values is None or keys.size != values.size:
        node.unsupported("LabelEncoder needs as many keys as values")
    if "default_tensor" in node.attrs:
        default = np.asarray(node.attr("default_tensor")).reshape(-1)[0].item()
    elif values.dtype.kind == "f":
        default = float(node.attr("default_float", -0.0))
    else:
        default = int(node.attr("default_int64", -1))
    # A repeated key keeps its first value, as onnxruntime's map does.
    _, first = np.unique(keys, return_index=True)
    first = np.sort(first)
    keys, values = keys[first], values[first]
    x = node.input(0)
    key_field = node.param(keys, f"{node.name}_keys", trainable=False)
    value_field = node.param(values, f"{node.name}_values", trainable=False)
    hit, found = node.tmp("hit"), node.tmp("found")
    fill = literal(float(default) if values.dtype.kind == "f" else int(default))
    return [
        f"{hit} = {x.expr}.unsqueeze_dim(-1).equal({key_field}.cast({x.expr}.dtype))",
        f"{found} = {hit}.any_dim(-1).squeeze_dims([-1])",
        f"{node.outputs[0]} = {value_field}.expand({hit}.shape).mask_fill({hit}.bool_not(), 0)"
        f".sum_dim(-1).squeeze_dims([-1]).mask_fill({found}.bool_not(), {fill})",
    ]


# ------------------------------------------------------------------------------ TreeEnsemble
def _depth(true_next: np.ndarray, false_next: np.ndarray, interior: int) -> int | None:
    """The most interior nodes on a path from a node to a leaf, or None for a cycle."""
    depth = np.zeros(true_next.size, np.int64)
    for _ in range(interior + 1):
        deeper = np.zeros_like(depth)
        deeper[:interior] = 1 + np.maximum(depth[true_next[:interior]], depth[false_next[:interior]])
        if np.array_equal(deeper, depth):
            return int(depth.max()) if depth.size else 0
        depth = deeper
    return None


def _post_transform(node: NodeContext, y: str, lines: list[str]) -> str:
    """The expression of the ``post_transform`` attribute applied to the scores ``y``."""
    transform = node.attr("post_transform", 0)
    if isinstance(transform, str):
        names = {v: k for k, v in _TRANSFORMS.items()}
        if transform not in names:
            node.unsupported(f"post_transform {transform!r}")
        transform = names[transform]
    if transform == 0:
        return y
    if transform == 1:
        return f"activation.softmax({y}, 1)"
    if transform == 2:
        return f"{y}.sigmoid()"
    if transform == 3:
        # A zero score stays zero and takes no share of the softmax.
        e = node.tmp("exp")
        lines.append(f"{e} = ({y} - {y}.max_dim(1)).exp().mask_fill({y}.equal_elem(0), 0.0)")
        return f"{e} / {e}.sum_dim(1)"
    if transform == 4:
        return _probit(node, y, lines)
    node.unsupported(f"post_transform {transform}")


def _probit(node: NodeContext, p: str, lines: list[str]) -> str:
    """The inverse of the standard normal CDF at ``p``: Winitzki's closed form for the
    inverse error function refined by two Newton steps on ``erf``."""
    z, log, v = node.tmp("z"), node.tmp("log"), node.tmp("v")
    lines += [
        f"{z} = {p} * 2.0 - 1.0",
        f"{log} = ((1.0 - {z}) * (1.0 + {z})).log()",
        f"{v} = 2.0 / (3.141592653589793 * 0.147) + 0.5 * {log}",
        f"{v} = ({z}.sign() * ((({v} * {v}) - {log} / 0.147).sqrt() - {v}).sqrt())",
    ]
    step = node.tmp("newton")
    for _ in range(2):
        # At p = 0 or 1 the value is infinite and the step 0/0: keep the infinity.
        lines += [f"{step} = ({v}.erf() - {z}) / ((-({v} * {v})).exp() * 1.1283791670955126)",
                  f"{v} = {v} - {step}.mask_fill({step}.is_nan(), 0.0)"]
    return f"{v} * 1.4142135623730951"


def _ints(node: NodeContext, name: str, size: int | None = None) -> np.ndarray:
    value = np.asarray(node.attr(name), np.int64).reshape(-1)
    if size is not None and value.size != size:
        node.unsupported(f"{name} has {value.size} entries, {size} were expected")
    return value


@converter("TreeEnsemble", since=5, domain=_ML,
           attrs=("aggregate_function", "leaf_targetids", "leaf_weights", "membership_values",
                  "n_targets", "nodes_falseleafs", "nodes_falsenodeids", "nodes_featureids",
                  "nodes_hitrates", "nodes_missing_value_tracks_true", "nodes_modes",
                  "nodes_splits", "nodes_trueleafs", "nodes_truenodeids", "post_transform",
                  "tree_roots"))  # fmt: skip
def tree_ensemble(node: NodeContext) -> list[str]:
    x = node.input(0)
    dtype = _float_dtype(node, x)
    if _rank(node, x) != 2:
        node.unsupported("TreeEnsemble needs a [batch, features] input")
    modes = _ints(node, "nodes_modes")
    count = modes.size
    features = _ints(node, "nodes_featureids", count)
    splits = np.asarray(node.attr("nodes_splits"), dtype).reshape(-1)
    true_ids, false_ids = _ints(node, "nodes_truenodeids", count), _ints(node, "nodes_falsenodeids", count)
    true_leaf = _ints(node, "nodes_trueleafs", count).astype(bool)
    false_leaf = _ints(node, "nodes_falseleafs", count).astype(bool)
    targets = _ints(node, "leaf_targetids")
    weights = np.asarray(node.attr("leaf_weights"), dtype).reshape(-1)
    roots = _ints(node, "tree_roots")
    n_targets = int(node.attr("n_targets", int(targets.max()) + 1 if targets.size else 1))
    missing = node.attr("nodes_missing_value_tracks_true", None)
    missing = np.zeros(count, np.int64) if missing is None else _ints(
        node, "nodes_missing_value_tracks_true", count)
    aggregate = int(node.attr("aggregate_function", 1))
    if aggregate not in _AGGREGATES:
        node.unsupported(f"aggregate_function {aggregate}")
    if splits.size != count or targets.size != weights.size or np.any(modes > _MEMBER):
        node.unsupported("the node attributes disagree in length, or a mode is unknown")
    if roots.size == 0 or np.any(targets >= n_targets) or np.any(targets < 0):
        node.unsupported("no tree roots, or a leaf target outside [0, n_targets)")

    # Positions 0..count-1 are interior nodes, count + j is leaf j (pointing at itself).
    leaves = weights.size
    total = count + leaves
    true_next = np.concatenate([np.where(true_leaf, true_ids + count, true_ids),
                                np.arange(count, total)])
    false_next = np.concatenate([np.where(false_leaf, false_ids + count, false_ids),
                                 np.arange(count, total)])
    if np.any(true_next >= total) or np.any(false_next >= total) or np.any(
            np.concatenate([true_next, false_next]) < 0):  # fmt: skip
        node.unsupported("a node points outside the node or leaf arrays")
    depth = _depth(true_next, false_next, count)
    if depth is None:
        node.unsupported("the trees have a cycle")
    pad = np.zeros(leaves, np.int64)

    def table(values: np.ndarray, hint: str) -> str:
        return node.param(values, f"{node.name}_{hint}", trainable=False)

    used = sorted(set(modes.tolist()))
    members = None
    if _MEMBER in used:
        members = _membership(node, modes, dtype, total)

    x_expr = x.expr
    pos, flat, size = node.tmp("position"), node.tmp("flat"), node.tmp("size")
    value, threshold, go = node.tmp("value"), node.tmp("threshold"), node.tmp("go")
    feature_t = table(np.concatenate([features, pad]), "features")
    split_t = table(np.concatenate([splits, np.zeros(leaves, dtype)]), "splits")
    true_t, false_t = table(true_next, "true_next"), table(false_next, "false_next")
    body = [
        f"{flat} = {pos}.reshape([-1])",
        f"{value} = {x_expr}.gather(1, {feature_t}.select(0, {flat}).reshape({size}))",
        f"{threshold} = {split_t}.select(0, {flat}).reshape({size})",
    ]
    if len(used) == 1 and used[0] != _MEMBER:
        body.append(f"{go} = {value}.{_COMPARE[used[0]]}({threshold})")
    else:
        mode = node.tmp("mode")
        mode_t = table(np.concatenate([modes, pad]), "modes")
        body.append(f"{mode} = {mode_t}.select(0, {flat}).reshape({size})")
        terms = []
        for m in used:
            if m == _MEMBER:
                test = (f"{table(members, 'members')}.select(0, {flat}).reshape({size} + "
                        f"[{members.shape[1]}]).equal({value}.unsqueeze_dim(2)).any_dim(2)"
                        f".squeeze_dims([2])")
            else:
                test = f"{value}.{_COMPARE[m]}({threshold})"
            terms.append(f"{mode}.equal_elem({m}).bool_and({test})")
        body.append(f"{go} = {terms[0]}")
        body += [f"{go} = {go}.bool_or({t})" for t in terms[1:]]
    if np.any(missing):
        missing_t = table(np.concatenate([missing, pad]), "missing_tracks_true")
        body.append(f"{go} = {go}.bool_or({value}.is_nan().bool_and("
                    f"{missing_t}.select(0, {flat}).reshape({size}).equal_elem(1)))")
    body.append(f"{pos} = {false_t}.select(0, {flat}).reshape({size}).mask_where({go}, "
                f"{true_t}.select(0, {flat}).reshape({size}))")

    # Each leaf's row over the targets: its weight at its target, the aggregate's neutral
    # value elsewhere.
    neutral = {2: np.finfo(dtype).max, 3: np.finfo(dtype).min}.get(aggregate, 0)
    rows = np.full((leaves, n_targets), neutral, dtype)
    rows[np.arange(leaves), targets] = weights
    trees = roots.size
    step, y = node.tmp("step"), node.tmp("scores")
    lines = [
        f"{size} = [{x_expr}.shape[0], {trees}]",
        f"{pos} = {table(roots, 'roots')}.unsqueeze_dim(0).repeat_dim(0, {x_expr}.shape[0])",
        f"for {step} in range({depth}):",
        *[_INDENT + line for line in body],
        f"{y} = {table(rows, 'leaf_rows')}.select(0, ({pos} - {count}).reshape([-1]))"
        f".reshape({size} + [{n_targets}])",
    ]
    if aggregate in (0, 1):
        lines.append(f"{y} = {y}.sum_dim(1).squeeze_dims([1])")
        if aggregate == 0:
            lines.append(f"{y} = {y} / {trees}.0")
    else:
        reduce = "min_dim" if aggregate == 2 else "max_dim"
        # A target that no tree's leaf reached scores 0, as in onnxruntime (the ONNX
        # reference leaves the neutral value there).
        hits = np.zeros((leaves, n_targets), np.int64)
        hits[np.arange(leaves), targets] = 1
        reached = node.tmp("reached")
        lines += [
            f"{reached} = {table(hits, 'leaf_hits')}.select(0, ({pos} - {count}).reshape([-1]))"
            f".reshape({size} + [{n_targets}]).sum_dim(1).squeeze_dims([1]).equal_elem(0)",
            f"{y} = {y}.{reduce}(1).squeeze_dims([1]).mask_fill({reached}, 0.0)",
        ]
    lines.append(f"{node.outputs[0]} = {_post_transform(node, y, lines)}")
    return lines


def _membership(node: NodeContext, modes: np.ndarray, dtype: np.dtype, total: int) -> np.ndarray:
    """The set of each MEMBER node as a row, padded with NaN (which equals nothing)."""
    values = node.attr("membership_values", None)
    if values is None:
        node.unsupported("MEMBER nodes need the membership_values attribute")
    values = np.asarray(values, dtype).reshape(-1)
    ends = np.flatnonzero(np.isnan(values))
    member_nodes = np.flatnonzero(modes == _MEMBER)
    if ends.size != member_nodes.size:
        node.unsupported("membership_values must hold one NaN-ended set per MEMBER node")
    sets = np.split(values, ends + 1)[: ends.size]
    width = max(1, max(s.size - 1 for s in sets))
    table = np.full((total, width), np.nan, dtype)
    for row, members in zip(member_nodes, sets, strict=True):
        table[row, : members.size - 1] = members[:-1]
    return table
