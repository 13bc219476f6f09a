"""ai.onnx.ml converters on hand-built models, compared with onnxruntime: tree ensembles
with every comparison mode, several targets, each aggregate and post transform, NaN
features; LabelEncoder with numeric keys; ArrayFeatureExtractor on a vector; Scaler and
LinearRegressor."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import ember  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.onnx.importer import convert  # noqa: E402
from ember.onnx.registry import UnsupportedOnnxError  # noqa: E402

RNG = np.random.default_rng(8)
_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
          np.dtype(np.int64): TensorProto.INT64}


def _model(node, x: np.ndarray, ml_opset: int, inputs=None):
    inputs = inputs or [("x", x)]
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, _TYPES[v.dtype], v.shape) for n, v in inputs],
        [helper.make_empty_tensor_value_info(node.output[0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", ml_opset)])
    return onnx.shape_inference.infer_shapes(model).SerializeToString()


def _check(model: bytes, feeds: dict[str, np.ndarray], rtol=1e-5, atol=1e-6):
    device = ember.device("ndarray")
    got = convert(model).build(device)(*(Tensor.from_data(v, device) for v in feeds.values()))
    expected = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = got.to_numpy()
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


def _random_trees(trees: int, depth: int, features: int, targets: int, modes: list[int]):
    """Flat TreeEnsemble attributes of ``trees`` random full trees of ``depth`` levels."""
    attrs: dict[str, list] = {k: [] for k in (
        "nodes_modes", "nodes_featureids", "nodes_splits", "nodes_truenodeids",
        "nodes_falsenodeids", "nodes_trueleafs", "nodes_falseleafs",
        "nodes_missing_value_tracks_true", "leaf_targetids", "leaf_weights", "tree_roots")}
    for t in range(trees):
        # Trees of different depths: the deepest decides the number of steps.
        levels = depth - (t % 2)
        base, leaf_base = len(attrs["nodes_modes"]), len(attrs["leaf_weights"])
        attrs["tree_roots"].append(base)
        interior = 2**levels - 1
        for i in range(interior):
            attrs["nodes_modes"].append(int(RNG.choice(modes)))
            attrs["nodes_featureids"].append(int(RNG.integers(features)))
            attrs["nodes_splits"].append(float(np.round(RNG.normal(), 1)))
            attrs["nodes_missing_value_tracks_true"].append(int(RNG.integers(2)))
            for side, child in (("true", 2 * i + 1), ("false", 2 * i + 2)):
                leaf = child >= interior
                attrs[f"nodes_{side}leafs"].append(int(leaf))
                attrs[f"nodes_{side}nodeids"].append(
                    leaf_base + child - interior if leaf else base + child)
        for _ in range(interior + 1):
            attrs["leaf_targetids"].append(int(RNG.integers(targets)))
            attrs["leaf_weights"].append(float(np.round(RNG.normal(), 2)))
    return attrs


def _tree_node(attrs, dtype, n_targets, **extra):
    tensors = {"nodes_modes": np.uint8, "nodes_splits": dtype, "leaf_weights": dtype}
    kwargs = {k: (numpy_helper.from_array(np.asarray(v, tensors[k]), k) if k in tensors else v)
              for k, v in attrs.items()}
    return helper.make_node("TreeEnsemble", ["x"], ["y"], domain="ai.onnx.ml",
                            n_targets=n_targets, **kwargs, **extra)


def _features(dtype, rows=12, features=4):
    x = np.round(RNG.normal(size=(rows, features)), 1).astype(dtype)
    x[0, :] = np.nan
    x[3, 1] = np.nan
    return x


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble_every_mode_and_aggregate(aggregate):
    attrs = _random_trees(trees=5, depth=3, features=4, targets=3, modes=[0, 1, 2, 3, 4, 5])
    x = _features(np.float32)
    # EQ splits that some features hit exactly.
    x[5] = np.asarray(attrs["nodes_splits"][:4], np.float32)
    node = _tree_node(attrs, np.float32, 3, aggregate_function=aggregate)
    _check(_model(node, x, 5), {"x": x})


@pytest.mark.parametrize("transform", [1, 2, 3, 4])
def test_tree_ensemble_post_transforms_double(transform):
    attrs = _random_trees(trees=3, depth=2, features=4, targets=3, modes=[0, 3])
    x = _features(np.float64)
    if transform == 4:  # probit of a probability: leaf weights in (0, 1)
        attrs["leaf_weights"] = [0.05 + 0.9 * abs(w) / 3 for w in attrs["leaf_weights"]]
        attrs["leaf_targetids"] = [0] * len(attrs["leaf_targetids"])
    node = _tree_node(attrs, np.float64, 3, post_transform=transform,
                      aggregate_function=0 if transform == 4 else 1)
    if transform in (1, 2):
        # onnxruntime 1.32 swaps these two codes (it reads 1 as LOGISTIC and 2 as SOFTMAX,
        # against the spec's SOFTMAX (1), LOGISTIC (2)): compare with the spec's transform of
        # its untransformed scores.
        plain = _model(_tree_node(attrs, np.float64, 3), x, 5)
        scores = ort.InferenceSession(plain, providers=["CPUExecutionProvider"]).run(None,
                                                                                     {"x": x})[0]
        if transform == 1:
            expected = np.exp(scores - scores.max(1, keepdims=True))
            expected /= expected.sum(1, keepdims=True)
        else:
            expected = 1 / (1 + np.exp(-scores))
        device = ember.device("ndarray")
        got = convert(_model(node, x, 5)).build(device)(Tensor.from_data(x, device)).to_numpy()
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)
        return
    # onnxruntime's probit uses a closed-form inverse erf good to about 1e-3.
    tolerance = {"rtol": 5e-3, "atol": 5e-3} if transform == 4 else {}
    _check(_model(node, x, 5), {"x": x}, **tolerance)


def test_tree_ensemble_membership_and_single_leaf_tree():
    # Tree 0: x0 in {1, 2} ? (x1 <= 0 ? leaf0 : leaf1) : leaf2; tree 1 is a lone leaf.
    attrs = {"nodes_modes": [6, 0, 0], "nodes_featureids": [0, 1, 0],
             "nodes_splits": [0.0, 0.0, 0.0], "nodes_truenodeids": [1, 0, 3],
             "nodes_falsenodeids": [2, 1, 3], "nodes_trueleafs": [0, 1, 1],
             "nodes_falseleafs": [1, 1, 1], "leaf_targetids": [0, 1, 0, 1],
             "leaf_weights": [1.0, 10.0, 100.0, 0.5], "tree_roots": [0, 2]}
    node = _tree_node(attrs, np.float32, 2, membership_values=numpy_helper.from_array(
        np.array([1.0, 2.0, np.nan], np.float32), "membership_values"))
    x = np.array([[1, -1], [2, 3], [3, -1], [np.nan, 0]], np.float32)
    _check(_model(node, x, 5), {"x": x})


def test_tree_ensemble_cycle_is_unsupported():
    attrs = {"nodes_modes": [0, 0], "nodes_featureids": [0, 0], "nodes_splits": [0.0, 0.0],
             "nodes_truenodeids": [1, 0], "nodes_falsenodeids": [1, 0],
             "nodes_trueleafs": [0, 0], "nodes_falseleafs": [0, 0], "leaf_targetids": [0],
             "leaf_weights": [1.0], "tree_roots": [0]}
    x = np.zeros((2, 1), np.float32)
    with pytest.raises(UnsupportedOnnxError, match="cycle"):
        convert(_model(_tree_node(attrs, np.float32, 1), x, 5))


@pytest.mark.parametrize("form", ["int_to_float", "float_to_int", "tensor"])
def test_label_encoder_numeric(form):
    if form == "int_to_float":
        attrs = {"keys_int64s": [3, 1, 7], "values_floats": [0.5, -2.0, 9.0],
                 "default_float": 4.25}
        x = np.array([[1, 2, 3], [7, 7, 0]], np.int64)
    elif form == "float_to_int":
        attrs = {"keys_floats": [0.5, 1.5], "values_int64s": [10, 20], "default_int64": -7}
        x = np.array([0.5, 1.5, 2.5, 0.5], np.float32)
    else:
        attrs = {"keys_tensor": numpy_helper.from_array(np.array([4, 5], np.int64), "k"),
                 "values_tensor": numpy_helper.from_array(np.array([1.5, 2.5], np.float32), "v"),
                 "default_tensor": numpy_helper.from_array(np.array([-1.0], np.float32), "d")}
        x = np.array([5, 4, 6], np.int64)
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml", **attrs)
    _check(_model(node, x, 4), {"x": x})


def test_label_encoder_string_keys_are_unsupported():
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml",
                            keys_strings=["a"], values_int64s=[1])
    x = np.zeros(2, np.int64)
    with pytest.raises(UnsupportedOnnxError, match="string"):
        convert(_model(node, x, 2))


def test_array_feature_extractor_on_a_vector_with_runtime_indices():
    x = RNG.normal(size=5).astype(np.float32)
    indices = np.array([4, 0, 2], np.int64)
    node = helper.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain="ai.onnx.ml")
    _check(_model(node, x, 1, [("x", x), ("i", indices)]), {"x": x, "i": indices})


def test_binarizer_on_ints():
    x = np.array([[-2, 0, 1, 5]], np.int64)
    node = helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.5)
    # onnxruntime implements Binarizer for floats only: compare with the spec's x > threshold.
    device = ember.device("ndarray")
    got = convert(_model(node, x, 1)).build(device)(Tensor.from_data(x, device)).to_numpy()
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, [[0, 0, 1, 1]])


def test_scaler_and_linear_regressor():
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    node = helper.make_node("Scaler", ["x"], ["y"], domain="ai.onnx.ml",
                            offset=[0.5, -1.0, 0.0, 2.0], scale=[2.0, 0.5, 1.0, -1.0])
    _check(_model(node, x, 1), {"x": x})
    node = helper.make_node("LinearRegressor", ["x"], ["y"], domain="ai.onnx.ml", targets=2,
                            coefficients=RNG.normal(size=8).tolist(), intercepts=[0.5, -0.25])
    _check(_model(node, x, 1), {"x": x}, rtol=1e-4, atol=1e-5)
