"""ONNX import as an attacker tries it: breakout payloads in every string slot of a model.

Each payload (quotes, triple quotes, backslashes, newlines, ``__import__``, format strings,
unicode line separators, keywords, dunders, empty and very long strings, NUL...) goes into
one slot (names, dims, doc strings, producer, domains, metadata, string attributes, also
inside If and Loop bodies) of a small valid model. The model must then either import, in
memory (``convert``) and through files (``import_onnx`` + ``load_model``), to code that
parses, holds only what the code generator emits, runs without side effect (the payload's
marker file never appears) and gives onnxruntime's outputs for the same model without the
payload; or be refused with an ``OnnxImportError`` whose message names the slot. Which of
the two is fixed per slot and payload (:func:`expected`), so the matrix cannot drift.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import keyword
import sys
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

onnx = pytest.importorskip("onnx", reason="the ONNX tests need the onnx package (ember[onnx])")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import ember  # noqa: E402
from ember import Tensor  # noqa: E402
from ember.module import Param  # noqa: E402
from ember.onnx import codegen, host, runtime  # noqa: E402
from ember.onnx.importer import convert, import_onnx, load_model  # noqa: E402
from ember.onnx.registry import OnnxImportError, UnsupportedOnnxError  # noqa: E402
from ember.onnx.vocabulary import Field, instantiate  # noqa: E402
from ember.tensor import DType, activation  # noqa: E402
from ember.tensor import module as functional  # noqa: E402

# ---------------------------------------------------------------------------------- payloads
# "{code}" becomes code that creates the marker file, if it ever runs; "{dcode}" the same
# code in double quotes (whose repr needs no escape, so it survives inside a repr).
CODE = "__import__('pathlib').Path({marker!r}).touch()"
DCODE = '__import__("pathlib").Path("{marker}").touch()'

PAYLOADS = {
    "single_quote": "x'); {code}; ('",
    "double_quote": 'x"); {code}; ("',
    "triple_double": '"""\n{code}\n"""',
    "triple_single": "'''\n{code}\n'''",
    "docstring_close": '""" + {code} + """',
    "docstring_statement": '""";{code};"""',
    "docstring_statement_single": "''';{code};'''",
    "docstring_statement_mixed": "'\"\"\";{code};\"\"\"'",
    "repr_docstring_statement": '""";{dcode};"""',
    "repr_docstring_statement_newline": '"""\n{dcode}\n"""',
    "repr_string_statement": '");{dcode};("',
    "escaped_triple": '\\"""\n{code}\n"""\\',
    "trailing_backslash": "name\\",
    "backslash_escapes": "\\n\\x41\\u2028\\'\\\"\\",
    "newline": "a\n{code}\n",
    "carriage_return": "a\r{code}\r",
    "crlf": "a\r\n{code}\r\n",
    "code": "{code}",
    "os_system": "__import__('os').system('touch /nonexistent/ember')",
    "format_positional": "{0}{1!r}",
    "format_dunder": "{__class__.__init__.__globals__}",
    "format_self": "{self.__dict__}",
    "percent": "%s%r%(x)s%%",
    "fstring": "f'{{{code}}}'",
    "line_separator": "a\u2028{code}",
    "paragraph_separator": "a\u2029{code}",
    "form_feed": "a\x0c{code}",
    "vertical_tab": "a\x0b{code}",
    "file_separators": "a\x1c{code}\x1d\x1e",
    "next_line": "a\x85{code}",
    "bidi_override": "a\u202e{code}\u202c",
    "nul": "a\x00{code}",
    "ansi_escape": "\x1b[2J\x1b]0;{code}\x07",
    "comment": "# {code}",
    "semicolon": "; {code}",
    "keyword_class": "class",
    "keyword_import": "import",
    "soft_keyword_match": "match",
    "underscore": "_",
    "none": "None",
    "builtin_input": "input",
    "builtin_getattr": "getattr",
    "self": "self",
    "tensor": "Tensor",
    "alias_rt": "rt",
    "module_forward": "forward",
    "module_load": "load",
    "dunder_import": "__import__",
    "dunder_builtins": "__builtins__",
    "dunder_class": "__class__",
    "empty": "",
    "whitespace": " \t ",
    "digits": "123",
    "non_ascii": "名前_é_😀",
    "very_long": "a" * 100_000,
    "very_long_breakout": "x'\"\\" * 25_000 + "\n{code}",
}


def payload_text(key: str, marker: Path) -> str:
    # str.replace, not str.format: the payloads hold format fields of their own.
    return PAYLOADS[key].replace("{code}", CODE.format(marker=str(marker))) \
        .replace("{dcode}", DCODE.format(marker=str(marker)))


# ------------------------------------------------------------------------------------ models
OPSET = 17
X = np.array([[-1.5, 0.0, 2.0], [3.0, -0.25, 0.5]], np.float32)
W = np.array([0.5, -1.0, 2.0], np.float32)


def _float(name: str, dims: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def _model(graph: onnx.GraphProto, opset: int = OPSET, **fields) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    for key, value in fields.items():
        setattr(model, key, value)
    return model


def simple(x="x", h="h", w="w", y="y", graph="g", relu="relu", add="add", batch="batch",
           out_batch="batch", hidden_dim="batch", graph_doc="", node_doc="", input_doc="",
           weight_doc="", relu_op="Relu", relu_domain="", attr_name=None, denotation="",
           **model_fields) -> onnx.ModelProto:  # fmt: skip
    """x [batch, 3] -> Relu -> h -> Add(h, w) -> y, with each name and text settable."""
    relu_node = helper.make_node(relu_op, [x], [h], name=relu, domain=relu_domain,
                                 doc_string=node_doc)  # fmt: skip
    if attr_name is not None:
        relu_node.attribute.append(helper.make_attribute(attr_name, 1))
    nodes = [relu_node, helper.make_node("Add", [h, w], [y], name=add)]
    weight = numpy_helper.from_array(W, w)
    weight.doc_string = weight_doc
    x_info = _float(x, [batch, 3])
    x_info.doc_string = input_doc
    x_info.type.denotation = denotation
    x_info.type.tensor_type.shape.dim[0].denotation = denotation
    built = helper.make_graph(nodes, graph, [x_info], [_float(y, [out_batch, 3])],
                              initializer=[weight], doc_string=graph_doc,
                              value_info=[_float(h, [hidden_dim, 3])])  # fmt: skip
    return _model(built, **model_fields)


def simple_feeds() -> list[np.ndarray]:
    return [X]


def with_opset_domain(domain: str) -> onnx.ModelProto:
    model = simple()
    model.opset_import.append(helper.make_opsetid(domain, 1))
    return model


def with_metadata(key: str, value: str) -> onnx.ModelProto:
    model = simple()
    helper.set_model_props(model, {key: value})
    return model


def with_function(name: str) -> onnx.ModelProto:
    """A model-local function (unused) named ``name`` in a domain of the same name."""
    model = simple()
    function = helper.make_function(name, name, ["a"], ["b"],
                                    [helper.make_node("Neg", ["a"], ["b"])],
                                    [helper.make_opsetid("", OPSET)])  # fmt: skip
    model.functions.append(function)
    return model


def with_unrelated_value_info(name: str) -> onnx.ModelProto:
    model = simple()
    model.graph.value_info.append(_float(name, [name, 3]))
    return model


def if_model(x="x", c="c", y="y", then_name="then", then_relu="then_relu", then_add="then_add",
             then_t="t1", then_out="t_out", then_w="wt", then_dim="batch", then_doc="",
             else_neg="else_neg", else_out="e_out", then_alpha=None) -> onnx.ModelProto:  # fmt: skip
    """y = relu(x) + wt if c else -x; the then branch's names and texts settable."""
    first = helper.make_node("Relu", [x], [then_t], name=then_relu)
    if then_alpha is not None:
        first = helper.make_node("LeakyRelu", [x], [then_t], name=then_relu)
        first.attribute.append(helper.make_attribute("alpha", then_alpha))
    then_branch = helper.make_graph(
        [first, helper.make_node("Add", [then_t, then_w], [then_out], name=then_add)],
        then_name, [], [_float(then_out, [then_dim, 3])],
        initializer=[numpy_helper.from_array(W, then_w)], doc_string=then_doc,
        value_info=[_float(then_t, [then_dim, 3])])  # fmt: skip
    else_branch = helper.make_graph([helper.make_node("Neg", [x], [else_out], name=else_neg)],
                                    "else", [], [_float(else_out, ["batch", 3])])  # fmt: skip
    node = helper.make_node("If", [c], [y], name="if", then_branch=then_branch,
                            else_branch=else_branch)  # fmt: skip
    inputs = [_float(x, ["batch", 3]), helper.make_tensor_value_info(c, TensorProto.BOOL, [])]
    return _model(helper.make_graph([node], "g", inputs, [_float(y, ["batch", 3])]))


def if_feeds() -> list[list[np.ndarray]]:
    return [[X, np.array(True)], [X, np.array(False)]]


def loop_model(body_name="body", body_x="x_in", body_out="x_out", body_node="step",
               body_w="wl", body_i="i", body_cond="cond_in") -> onnx.ModelProto:  # fmt: skip
    """y = x + 2 * wl: a Loop of 2 steps whose body adds its initializer ``wl``."""
    body = helper.make_graph(
        [helper.make_node("Identity", [body_cond], ["cond_out"], name="keep_going"),
         helper.make_node("Add", [body_x, body_w], [body_out], name=body_node)],
        body_name,
        [helper.make_tensor_value_info(body_i, TensorProto.INT64, []),
         helper.make_tensor_value_info(body_cond, TensorProto.BOOL, []),
         _float(body_x, ["batch", 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         _float(body_out, ["batch", 3])],
        initializer=[numpy_helper.from_array(W, body_w)])  # fmt: skip
    node = helper.make_node("Loop", ["trips", "", "x"], ["y"], name="loop", body=body)
    trips = numpy_helper.from_array(np.array(2, np.int64), "trips")
    return _model(helper.make_graph([node], "g", [_float("x", ["batch", 3])],
                                    [_float("y", ["batch", 3])], initializer=[trips]))


def one_op(op: str, inputs: list[onnx.ValueInfoProto], extra_inputs=(), opset=OPSET,
           **attrs) -> onnx.ModelProto:  # fmt: skip
    """One ``op`` node from the graph inputs (and initializers ``extra_inputs``) to y."""
    names = [i.name for i in inputs] + [t.name for t in extra_inputs]
    node = helper.make_node(op, names, ["y"], name="op", **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_empty_tensor_value_info("y")],
                              initializer=list(extra_inputs))  # fmt: skip
    return _model(graph, opset)


IMAGE = np.arange(2 * 8 * 4 * 4, dtype=np.float32).reshape(2, 8, 4, 4) / 10 - 3


def _attr_model(op: str, attr: str, **kind) -> Callable[[str | None], onnx.ModelProto]:
    """A one-op model whose string attribute ``attr`` is the payload (left out for None)."""
    spec = ATTR_MODELS[op]

    def build(p: str | None) -> onnx.ModelProto:
        attrs = dict(spec.get("attrs", {}))
        if p is not None:
            attrs[attr] = p
        return one_op(op, spec["inputs"](), spec.get("extra", lambda: ())(),
                      spec.get("opset", OPSET), **attrs)  # fmt: skip

    return build


ATTR_MODELS: dict[str, dict] = {
    "Gelu": {"inputs": lambda: [_float("x", [2, 3])], "opset": 20},
    "Pad": {"inputs": lambda: [_float("x", [2, 3])], "opset": 18,
            "extra": lambda: [numpy_helper.from_array(np.array([0, 1, 0, 1], np.int64), "p")]},
    "DepthToSpace": {"inputs": lambda: [_float("x", [2, 8, 4, 4])], "attrs": {"blocksize": 2}},
    "MaxPool": {"inputs": lambda: [_float("x", [2, 8, 4, 4])], "attrs": {"kernel_shape": [2, 2]}},
    "Einsum": {"inputs": lambda: [_float("x", [2, 3])], "attrs": {"equation": "ij->ji"}},
    "Resize": {"inputs": lambda: [_float("x", [2, 8, 4, 4])], "opset": 13,
               "extra": lambda: [numpy_helper.from_array(np.zeros(0, np.float32), "roi"),
                                 numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32),
                                                         "scales")]},
    "LeakyRelu": {"inputs": lambda: [_float("x", [2, 3])]},
    "LSTM": {"inputs": lambda: [_float("x", [2, 1, 3])], "attrs": {"hidden_size": 2},
             "extra": lambda: [
                 numpy_helper.from_array(np.linspace(-1, 1, 24, dtype=np.float32)
                                         .reshape(1, 8, 3), "W"),
                 numpy_helper.from_array(np.linspace(1, -1, 16, dtype=np.float32)
                                         .reshape(1, 8, 2), "R")]},
    "BitShift": {"inputs": lambda: [helper.make_tensor_value_info("x", TensorProto.UINT8, [3])],
                 "extra": lambda: [numpy_helper.from_array(np.array([1, 2, 3], np.uint8), "s")]},
}  # fmt: skip
ATTR_FEEDS = {"Gelu": [X], "Pad": [X], "DepthToSpace": [IMAGE], "MaxPool": [IMAGE],
              "Einsum": [X], "Resize": [IMAGE], "LeakyRelu": [X],
              "LSTM": [X.reshape(2, 1, 3)], "BitShift": [np.array([1, 8, 255], np.uint8)]}  # fmt: skip


def string_constant(p: str) -> onnx.ModelProto:
    node = helper.make_node("Constant", [], ["y"], name="c", value_string=p)
    return _model(helper.make_graph([node], "g", [], [helper.make_empty_tensor_value_info("y")]))


def string_tensor_constant(p: str) -> onnx.ModelProto:
    tensor = helper.make_tensor("v", TensorProto.STRING, [1], [p.encode("utf-8")])
    node = helper.make_node("Constant", [], ["s"], name="c", value=tensor)
    size = helper.make_node("Size", ["s"], ["y"], name="size")
    return _model(helper.make_graph([node, size], "g", [], [
        helper.make_tensor_value_info("y", TensorProto.INT64, [])]))


def string_initializer(p: str) -> onnx.ModelProto:
    tensor = helper.make_tensor("s", TensorProto.STRING, [1], [p.encode("utf-8")])
    node = helper.make_node("Identity", ["s"], ["y"], name="copy")
    return _model(helper.make_graph([node], "g", [], [
        helper.make_tensor_value_info("y", TensorProto.STRING, [1])], initializer=[tensor]))


# --------------------------------------------------------------------------------- the slots
@dataclass(frozen=True)
class Slot:
    """A place in a model that a payload goes into.

    ``build(payload)`` gives the model (``build(None)``: the same model without the
    payload, whose onnxruntime outputs are the reference, unless ``own_reference``: then
    onnxruntime runs the model with the payload, a valid attribute value); ``feeds`` the
    input sets to run; ``refuse`` the words of which a refusal's message must hold one;
    ``outcome(payload)`` whether the model must import or be refused.
    """

    build: Callable[[str | None], onnx.ModelProto]
    feeds: Callable[[], list[list[np.ndarray]]]
    refuse: tuple[str, ...] = ()
    outcome: Callable[[str], str] = lambda p: "import"
    own_reference: bool = False


def _simple(key: str, **fixed) -> Callable[[str | None], onnx.ModelProto]:
    return lambda p: simple(**fixed) if p is None else simple(**{key: p}, **fixed)


def _if(key: str) -> Callable[[str | None], onnx.ModelProto]:
    return lambda p: if_model() if p is None else if_model(**{key: p})


def _loop(key: str) -> Callable[[str | None], onnx.ModelProto]:
    return lambda p: loop_model() if p is None else loop_model(**{key: p})


def _or_simple(build: Callable[[str], onnx.ModelProto]) -> Callable[[str | None], onnx.ModelProto]:
    return lambda p: simple() if p is None else build(p)


def _import_unless_empty(p: str) -> str:
    return "refuse" if p == "" else "import"


def _import_only_if_empty(p: str) -> str:
    return "import" if p == "" else "refuse"


def _import_if_an_equation(p: str) -> str:
    """Einsum of one 2-d operand: two ASCII letters are a valid (implicit) equation."""
    return "import" if len(p) == 2 and p.isascii() and p.isalpha() else "refuse"


def _import_if_a_direction(p: str) -> str:
    return "import" if p in ("forward", "reverse", "bidirectional") else "refuse"


def _always_refuse(p: str) -> str:
    return "refuse"


SIMPLE = lambda: [simple_feeds()]  # noqa: E731
IF = if_feeds
LOOP = lambda: [[X]]  # noqa: E731
EMPTY_NAME = ("empty name", "missing")

SLOTS: dict[str, Slot] = {
    # the model and its graph
    "graph_name": Slot(_simple("graph"), SIMPLE),
    "graph_doc_string": Slot(_simple("graph_doc"), SIMPLE),
    "model_doc_string": Slot(_simple("doc_string"), SIMPLE),
    "producer_name": Slot(_simple("producer_name"), SIMPLE),
    "producer_version": Slot(_simple("producer_version"), SIMPLE),
    "model_domain": Slot(_simple("domain"), SIMPLE),
    "metadata_key": Slot(_or_simple(lambda p: with_metadata(p, "v")), SIMPLE),
    "metadata_value": Slot(_or_simple(lambda p: with_metadata("k", p)), SIMPLE),
    "opset_domain": Slot(_or_simple(with_opset_domain), SIMPLE, ("opset_import",),
                         _import_unless_empty),
    "local_function": Slot(_or_simple(with_function), SIMPLE),
    # names and dims
    "input_name": Slot(_simple("x"), SIMPLE, EMPTY_NAME, _import_unless_empty),
    "output_name": Slot(_simple("y"), SIMPLE, EMPTY_NAME, _import_unless_empty),
    "value_name": Slot(_simple("h"), SIMPLE, EMPTY_NAME, _import_unless_empty),
    "initializer_name": Slot(_simple("w"), SIMPLE, EMPTY_NAME, _import_unless_empty),
    "node_name": Slot(_simple("relu"), SIMPLE),
    "input_dim_param": Slot(_simple("batch"), SIMPLE),
    "output_dim_param": Slot(_simple("out_batch"), SIMPLE),
    "value_dim_param": Slot(_simple("hidden_dim"), SIMPLE),
    "unrelated_value_info": Slot(_or_simple(with_unrelated_value_info), SIMPLE),
    "input_doc_string": Slot(_simple("input_doc"), SIMPLE),
    "initializer_doc_string": Slot(_simple("weight_doc"), SIMPLE),
    "node_doc_string": Slot(_simple("node_doc"), SIMPLE),
    "denotation": Slot(_simple("denotation"), SIMPLE),
    # the op and its attributes
    "node_op_type": Slot(_simple("relu_op"), SIMPLE, ("converter",), _always_refuse),
    "node_domain": Slot(_simple("relu_domain"), SIMPLE, ("converter",),
                        _import_only_if_empty),
    "attribute_name": Slot(_simple("attr_name"), SIMPLE, ("attribute",), _always_refuse),
    "gelu_approximate": Slot(_attr_model("Gelu", "approximate"), lambda: [ATTR_FEEDS["Gelu"]],
                             ("approximate",), _always_refuse),
    "pad_mode": Slot(_attr_model("Pad", "mode"), lambda: [ATTR_FEEDS["Pad"]], ("mode",),
                     _always_refuse),
    "depth_to_space_mode": Slot(_attr_model("DepthToSpace", "mode"),
                                lambda: [ATTR_FEEDS["DepthToSpace"]], ("mode",), _always_refuse),
    "max_pool_auto_pad": Slot(_attr_model("MaxPool", "auto_pad"),
                              lambda: [ATTR_FEEDS["MaxPool"]], ("auto_pad",),
                              _import_only_if_empty),
    "einsum_equation": Slot(_attr_model("Einsum", "equation"), lambda: [ATTR_FEEDS["Einsum"]],
                            ("equation",), _import_if_an_equation, own_reference=True),
    "resize_mode": Slot(_attr_model("Resize", "mode"), lambda: [ATTR_FEEDS["Resize"]],
                        ("mode",), _always_refuse),
    "lstm_direction": Slot(_attr_model("LSTM", "direction"), lambda: [ATTR_FEEDS["LSTM"]],
                           ("direction",), _import_if_a_direction, own_reference=True),
    "lstm_activations": Slot(lambda p: _attr_model("LSTM", "activations")(
        None if p is None else [p, p, p]), lambda: [ATTR_FEEDS["LSTM"]], ("activation",),
        _always_refuse),
    "bit_shift_direction": Slot(_attr_model("BitShift", "direction"),
                                lambda: [ATTR_FEEDS["BitShift"]], ("direction",),
                                _always_refuse),
    "float_attribute_as_string": Slot(_attr_model("LeakyRelu", "alpha"),
                                      lambda: [ATTR_FEEDS["LeakyRelu"]], ("'alpha'",),
                                      _always_refuse),
    "string_constant": Slot(_or_simple(string_constant), SIMPLE, ("string",), _always_refuse),
    "string_tensor_constant": Slot(_or_simple(string_tensor_constant), SIMPLE,
                                   ("dtype", "type"), _always_refuse),
    "string_initializer": Slot(_or_simple(string_initializer), SIMPLE, ("dtype", "type"),
                               _always_refuse),
    # inside an If's branch
    "if_branch_name": Slot(_if("then_name"), IF),
    "if_branch_doc_string": Slot(_if("then_doc"), IF),
    "if_branch_node_name": Slot(_if("then_relu"), IF),
    "if_else_node_name": Slot(_if("else_neg"), IF),
    "if_branch_value_name": Slot(_if("then_t"), IF, EMPTY_NAME, _import_unless_empty),
    "if_branch_output_name": Slot(_if("then_out"), IF, EMPTY_NAME, _import_unless_empty),
    "if_branch_initializer_name": Slot(_if("then_w"), IF, EMPTY_NAME, _import_unless_empty),
    "if_branch_dim_param": Slot(_if("then_dim"), IF),
    "if_branch_float_attribute_as_string": Slot(_if("then_alpha"), IF, ("'alpha'",),
                                                _always_refuse),
    "if_condition_name": Slot(_if("c"), IF, EMPTY_NAME, _import_unless_empty),
    # inside a Loop's body
    "loop_body_name": Slot(_loop("body_name"), LOOP),
    "loop_body_input_name": Slot(_loop("body_x"), LOOP, EMPTY_NAME, _import_unless_empty),
    "loop_body_counter_name": Slot(_loop("body_i"), LOOP, EMPTY_NAME, _import_unless_empty),
    "loop_body_output_name": Slot(_loop("body_out"), LOOP, EMPTY_NAME, _import_unless_empty),
    "loop_body_node_name": Slot(_loop("body_node"), LOOP),
    "loop_body_initializer_name": Slot(_loop("body_w"), LOOP, EMPTY_NAME,
                                       _import_unless_empty),
}  # fmt: skip


def expected(slot: str, payload: str) -> str:
    """"import" or "refuse": what ember must do with ``payload`` in ``slot``."""
    return SLOTS[slot].outcome(payload_text(payload, Path("marker")))


def matrix_counts() -> Counter:
    """How many cases the matrix holds, by expected outcome (for the record)."""
    return Counter(expected(s, p) for s in SLOTS for p in PAYLOADS)


# ------------------------------------------------------------------- what generated code holds
# The imports the code generator writes: its fixed header, the aliases converters use, and
# ember layers (fields) or ember.onnx.ops helpers (a few converters' lines).
HEADER_IMPORTS = {
    ("__future__", "annotations"), ("pathlib", "Path"), ("ember.backend.device", "Device"),
    ("ember.onnx.imported", "ImportedModel"), ("ember.module", "Param"), ("ember.record", "DefaultRecorder"),
    ("ember.record", "DoublePrecision"), ("ember.record", "NamedMpkFileRecorder"),
}  # fmt: skip
ALIAS_IMPORTS = {
    (statement.module, alias.name)
    for line in codegen.ALIASES.values()
    for statement in ast.parse(line).body
    if isinstance(statement, ast.ImportFrom)
    for alias in statement.names
}
# Names generated code may call: the builtins the generator uses, and its own functions.
CALLABLE_NAMES = {"range", "int", "float", "bool", "len", "list", "tuple", "min", "max", "abs",
                  "sum", "slice", "round", "zip", "enumerate", "isinstance", "dict", "sorted",
                  "reversed", "any", "all", "divmod", "Path", "Model", "build"}  # fmt: skip
FORBIDDEN_NAMES = {"exec", "eval", "compile", "__import__", "open", "getattr", "setattr",
                   "delattr", "globals", "locals", "vars", "breakpoint", "input", "type",
                   "object", "__builtins__", "memoryview", "help", "print", "exit", "quit"}  # fmt: skip


def _public(*owners) -> set[str]:
    return {n for owner in owners for n in dir(owner) if not n.startswith("_")}


def _runtime_functions() -> set[str]:
    found = set()
    for module in (runtime, host, activation, functional):
        for name in dir(module):
            value = getattr(module, name)
            if not name.startswith("_") and callable(value) and \
                    getattr(value, "__module__", "").startswith("ember."):
                found.add(name)
    return found


# Attributes generated code may call: ember's runtime functions, Tensor, Param and dtype
# methods, the layers' config builders, and the module template's own few calls.
CALLABLE_ATTRIBUTES = (_runtime_functions() | _public(Tensor, Param, DType.F32)
                       | {"init", "Explicit", "load_file", "append", "get", "devices",
                          "val"})  # fmt: skip


def generated_code_problems(source: str) -> list[str]:
    """What ``source`` holds beyond the code generator's vocabulary: an import it does not
    write, a call of a name or an attribute outside the allow-lists, a dunder, a name that
    runs text as code or opens a file."""
    tree = ast.parse(source)
    problems = []
    fields = {n.target.id for cls in tree.body if isinstance(cls, ast.ClassDef)
              for n in cls.body if isinstance(n, ast.AnnAssign)
              and isinstance(n.target, ast.Name)}  # fmt: skip
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            problems.append(f"import {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                key = (node.module, alias.name)
                if not (key in HEADER_IMPORTS or key in ALIAS_IMPORTS
                        or node.module.startswith(("ember.nn.", "ember.onnx.ops."))):
                    problems.append(f"import of {alias.name} from {node.module}")
                imported.add(alias.asname or alias.name)
        elif isinstance(node, ast.Name):
            if node.id in FORBIDDEN_NAMES or (node.id.startswith("__")
                                              and node.id != "__file__"):
                problems.append(f"name {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            problems.append(f"attribute {node.attr}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name):
            if func.id not in CALLABLE_NAMES and func.id not in imported:
                problems.append(f"call of {func.id}")
        elif isinstance(func, ast.Attribute):
            is_field = isinstance(func.value, ast.Name) and func.value.id == "self" \
                and func.attr in fields
            # ``with_*``: a layer config's setters (``LinearConfig(3, 4).with_bias(False)``)
            if not (func.attr in CALLABLE_ATTRIBUTES or func.attr.startswith("with_")
                    or is_field or func.attr in imported):
                problems.append(f"call of .{func.attr}")
        else:
            problems.append(f"call of {ast.unparse(func)}")
    return problems


# -------------------------------------------------------------------------------- the matrix
def _reference(slot: Slot, model: onnx.ModelProto) -> list[list[np.ndarray]]:
    """onnxruntime's outputs for the model without the payload (or, for an attribute
    value that is valid, with it)."""
    data = (model if slot.own_reference else slot.build(None)).SerializeToString()
    if data not in _REFERENCES:
        session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        _REFERENCES[data] = [session.run(None, dict(zip(names, feeds))) for feeds in slot.feeds()]
    return _REFERENCES[data]


_REFERENCES: dict[bytes, list[list[np.ndarray]]] = {}
DEVICE = ember.device("ndarray")


def _run(model, feeds: list[np.ndarray]) -> list[np.ndarray]:
    outputs = model(*(Tensor.from_data(x, DEVICE) for x in feeds))
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return [o.to_numpy() for o in outputs]


def _check_runs(model, slot: Slot, proto: onnx.ModelProto, what: str) -> None:
    for feeds, want in zip(slot.feeds(), _reference(slot, proto)):
        got = _run(model, feeds)
        assert len(got) == len(want), what
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=what)


@pytest.mark.parametrize("payload", list(PAYLOADS))
@pytest.mark.parametrize("slot", list(SLOTS))
def test_payload_in_slot(slot: str, payload: str, tmp_path: Path) -> None:
    spec = SLOTS[slot]
    marker = tmp_path / "MARKER"
    model = spec.build(payload_text(payload, marker))
    outcome = expected(slot, payload)
    name = "m_" + hashlib.sha1(f"{slot}/{payload}".encode()).hexdigest()[:10]
    try:
        conversion = convert(model, name=name)
    except OnnxImportError as error:
        assert not marker.exists(), "the payload ran during the import"
        assert outcome == "refuse", f"refused, but {slot} must import: {error}"
        message = str(error).lower()
        assert any(word.lower() in message for word in spec.refuse), \
            f"the refusal does not name the slot {spec.refuse}: {error}"
        with pytest.raises(OnnxImportError):
            import_onnx(model, tmp_path / "out", name=name)
        assert not (tmp_path / "out" / f"{name}.py").exists()
        return
    assert outcome == "import", f"{slot} with this payload must be refused"
    assert generated_code_problems(conversion.source) == []
    _check_runs(conversion.build(DEVICE), spec, model, "in memory")
    assert not marker.exists(), "the payload ran"
    result = import_onnx(model, tmp_path / "out", name=name)
    written = result.code.read_text(encoding="utf-8")
    assert written == conversion.source
    ast.parse(written)
    _check_runs(load_model(tmp_path / "out", DEVICE, name=name), spec, model, "from files")
    assert not marker.exists(), "the payload ran"
    assert result.inputs == tuple(i.name for i in model.graph.input
                                  if i.name not in {t.name for t in model.graph.initializer})


def test_the_matrix_covers_every_slot_with_every_payload():
    counts = matrix_counts()
    assert counts["import"] + counts["refuse"] == len(SLOTS) * len(PAYLOADS)
    assert counts["import"] > counts["refuse"] > 0


# ------------------------------------------------------------------------- invalid UTF-8 text
@pytest.mark.parametrize(("slot", "placeholder"), [
    ("graph name", b"gxyz"), ("node name", b"rxyz"), ("input name", b"ixyz"),
    ("dim_param", b"bxyz"), ("producer", b"pxyz"), ("doc string", b"dxyz"),
])  # fmt: skip
@pytest.mark.parametrize("bad", [b"\xed\xa0\x80\x41", b"\xff\xfe\x00\x41", b"\xc0\xaf\xe0\x80"])
def test_text_that_is_not_utf8_is_refused_naming_the_field(slot, placeholder, bad, tmp_path):
    """Lone surrogates and other invalid UTF-8 (protobuf hands them over as bytes) are
    refused with the field's path, before any code is written."""
    model = simple(graph="gxyz", relu="rxyz", x="ixyz", batch="bxyz", producer_name="pxyz",
                   doc_string="dxyz")  # fmt: skip
    data = model.SerializeToString()
    assert data.count(placeholder) >= 1
    data = data.replace(placeholder, bad)
    with pytest.raises(OnnxImportError, match="is not valid UTF-8") as info:
        convert(data)
    assert "model." in str(info.value)
    with pytest.raises(OnnxImportError):
        import_onnx(data, tmp_path, name="m")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ the names made
def test_names_that_sanitise_alike_stay_distinct_and_in_order():
    names = ["a-b", "a_b", "A.B", "a b", "a__b", "_a_b_", "a\u2028b", "a\x00b"]
    inputs = [_float(n, [2]) for n in names]
    # y = sum of input_i * (i + 1): each input must land in its own argument.
    nodes, last = [], None
    for i, n in enumerate(names):
        k = numpy_helper.from_array(np.full(2, i + 1, np.float32), f"k{i}")
        nodes.append(helper.make_node("Mul", [n, k.name], [f"p{i}"]))
        if last is not None:
            nodes.append(helper.make_node("Add", [last, f"p{i}"], [f"s{i}"]))
        last = f"p{i}" if last is None else f"s{i}"
    consts = [numpy_helper.from_array(np.full(2, i + 1, np.float32), f"k{i}")
              for i in range(len(names))]
    graph = helper.make_graph(nodes, "g", inputs, [_float(last, [2])], initializer=consts)
    conversion = convert(_model(graph))
    tree = ast.parse(conversion.source)
    forward = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                   and n.name == "forward")  # fmt: skip
    args = [a.arg for a in forward.args.args[1:]]
    assert len(set(args)) == len(names) and all(a.isidentifier() for a in args)
    assert all(a.isascii() and not a.startswith("_") for a in args)
    assert conversion.input_names == names
    recorded = conversion.module().ONNX_INPUTS
    assert recorded == tuple(names)
    feeds = [np.array([10.0**i, -(10.0**i)], np.float32) for i in range(len(names))]
    got = _run(conversion.build(DEVICE), feeds)[0]
    np.testing.assert_allclose(got, sum((i + 1) * f for i, f in enumerate(feeds)))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.text(max_size=80), min_size=1, max_size=20))
def test_made_names_are_plain_unique_identifiers(texts):
    from ember.onnx.translate import RESERVED, Namer

    namer = Namer()
    made = [namer.fresh(t) for t in texts]
    assert len(set(made)) == len(made)
    for name in made:
        assert name.isidentifier() and name.isascii() and name == name.lower()
        assert not name.startswith("_") and "__" not in name and len(name) <= 80
        assert name not in RESERVED and not keyword.iskeyword(name)


@pytest.mark.parametrize("name", sorted({*keyword.kwlist,
                                         *keyword.softkwlist,
                                         *dir(builtins), "self", "Tensor", "rt", "F",
                                         "activation", "forward", "load", "build", "Model",
                                         "WEIGHTS", "RECORDER", "GRAPH_NAME", "device",
                                         "save_file", "map", "inf", "nan"}))  # fmt: skip
def test_a_value_named_like_a_keyword_builtin_or_reserved_name_gets_its_own_identifier(name):
    conversion = convert(simple(x=name, h=name + "_h", w=name + "_w"))
    tree = ast.parse(conversion.source)
    forward = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                   and n.name == "forward")  # fmt: skip
    (arg,) = [a.arg for a in forward.args.args[1:]]
    assert arg != name and arg.isidentifier()
    assert not keyword.iskeyword(arg) and arg not in dir(builtins)
    assert generated_code_problems(conversion.source) == []
    got = _run(conversion.build(DEVICE), [X])[0]
    np.testing.assert_allclose(got, np.maximum(X, 0) + W)


# ---------------------------------------------------- converters that would let text through
def test_a_converter_writing_model_text_into_its_lines_is_refused(monkeypatch, tmp_path):
    """The check behind the converters: a converter that pasted a node's name into code
    (as a buggy one might) gets the model refused, folded at import time or not."""
    from ember.onnx import registry

    marker = tmp_path / "MARKER"
    spec = registry.lookup("Relu", "", OPSET)

    def careless(node):
        return f"{node.outputs[0]} = {node.input(0).expr}; {node.name}"

    patched = registry.ConverterSpec(spec.op_type, spec.domain, spec.since, careless,
                                     spec.attrs, spec.limits, spec.foldable)  # fmt: skip
    monkeypatch.setitem(registry._REGISTRY, ("", "Relu"), [patched])
    hostile = simple(relu=CODE.format(marker=str(marker)))
    with pytest.raises(OnnxImportError, match="generated code may not contain"):
        convert(hostile)
    # Folded: a Relu of a constant runs its converter's lines at import time.
    node = helper.make_node("Relu", ["k"], ["y"], name=CODE.format(marker=str(marker)))
    folded = _model(helper.make_graph([node], "g", [], [_float("y", [3])],
                                      initializer=[numpy_helper.from_array(W, "k")]))
    with pytest.raises(OnnxImportError, match="generated code may not contain"):
        convert(folded)
    assert not marker.exists()


def test_a_converter_that_fails_on_an_odd_node_gives_a_typed_error(monkeypatch):
    from ember.onnx import registry

    spec = registry.lookup("Relu", "", OPSET)

    def fragile(node):
        return f"{node.outputs[0]} = {node.input(0).expr}" + node.attr("missing", None)

    patched = registry.ConverterSpec(spec.op_type, spec.domain, spec.since, fragile,
                                     spec.attrs, spec.limits, spec.foldable)  # fmt: skip
    monkeypatch.setitem(registry._REGISTRY, ("", "Relu"), [patched])
    with pytest.raises(OnnxImportError, match=r"node 'relu' \(Relu\): the converter failed on "
                                              r"this node: TypeError"):  # fmt: skip
        convert(simple())


@pytest.mark.parametrize("line", [
    "y = __import__('os')",
    "y = x.__class__",
    "y = eval('1')",
    "y = open('f')",
    "y = getattr(x, 'exp')()",
    "y = rt.np.save('f', 1)",
    "y = self.save_file('f', None)",
    "y = x.to_numpy().tofile('f')",
    "import os",
    "from os import system",
    "from ember.onnx.ops.image import importlib",
    "class A: pass",
    "def f(): pass",
    "with x: pass",
    "y = (lambda: 1)() if x else Path('f')",
    "y = x\n  z = 1",
    "y = 'unterminated",
    "y = x\x00",
])  # fmt: skip
def test_lines_outside_the_vocabulary_are_refused(line):
    from ember.onnx.vocabulary import check_lines

    with pytest.raises(OnnxImportError, match="generated code may not contain"):
        check_lines([line], "node 'n' (Op)", {"x", "y", "z"}.__contains__, {"w"}.__contains__)


def test_lines_within_the_vocabulary_pass():
    from ember.onnx.vocabulary import check_lines

    check_lines(["y = rt.reshape(x, [0, -1]).exp() + self.w.val()",
                 "z = [t.sum_dim(0) for t in Tensor.cat([y, y], 0).split(1, 0)]",
                 "if len(z) > 1:", "    y = activation.relu(y)", "else:", "    pass",
                 "from ember.onnx.ops.image import decode_image as decode"],
                "node 'n' (Op)", {"x", "y", "z"}.__contains__, {"w"}.__contains__)  # fmt: skip


@pytest.mark.parametrize(("build", "imports"), [
    ("__import__('pathlib').Path({m!r}).touch()", ()),
    ("LinearConfig(3, 4).save({m!r})", ("from ember.nn.linear import Linear, LinearConfig",)),
    ("LinearConfig(3, 4).init(device) if Path({m!r}).touch() else None",
     ("from ember.nn.linear import Linear, LinearConfig",)),
    ("Linear.__init__", ("from ember.nn.linear import Linear, LinearConfig",)),
    ("LinearConfig(3, 4).init(device)", ("import os",)),
    ("LinearConfig(3, 4).init(device)", ("from pathlib import Path",)),
    ("LinearConfig(3, 4).init(device)", ("from ember.nn.linear import Linear\nPath({m!r})",)),
    ("LinearConfig(3, 4).init(device)",
     ("from ember.nn.linear import LinearConfig; __import__('pathlib').Path({m!r}).touch()",)),
])  # fmt: skip
def test_instantiate_refuses_builds_and_imports_outside_the_vocabulary(build, imports, tmp_path):
    """``instantiate`` execs a field's imports and evals its build at import time (folding
    a layer): both are checked first, so no text can run there."""
    marker = tmp_path / "MARKER"
    item = Field("f", "Linear", build.format(m=str(marker)),
                 {"weight": np.zeros((3, 4), np.float32)},
                 tuple(i.format(m=str(marker)) for i in imports))  # fmt: skip
    with pytest.raises(OnnxImportError):
        instantiate(item, DEVICE)
    assert not marker.exists()


def test_instantiate_builds_a_layer_within_the_vocabulary():
    weight = np.arange(12, dtype=np.float32).reshape(3, 4)
    item = Field("f", "Linear", "LinearConfig(3, 4).with_bias(False).init(device)",
                 {"weight": weight}, ("from ember.nn.linear import Linear, LinearConfig",))
    layer = instantiate(item, DEVICE)
    np.testing.assert_array_equal(layer.weight.val().to_numpy(), weight)


def test_field_builds_never_hold_model_text():
    """Every field of a model full of payload names is built from literals and ``device``
    only: the build expressions hold no string but a dtype's name."""
    marker = Path("/nonexistent/MARKER")
    payload = payload_text("triple_double", marker)
    conversion = convert(simple(x=payload, h=payload + "h", w=payload + "w", relu=payload,
                                graph=payload, batch=payload))  # fmt: skip
    for item in conversion.program.fields:
        strings = [n.value for n in ast.walk(ast.parse(item.build, mode="eval"))
                   if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        assert all(s in {d.value for d in DType} for s in strings), item.build
        assert item.name.isidentifier() and item.name.isascii()


# ----------------------------------------------------------------------- the command line
def test_the_cli_escapes_a_hostile_name_it_prints(tmp_path, capsys):
    from ember.onnx.cli import main

    path = tmp_path / "m.onnx"
    onnx.save(simple(x="x\x1b[2J\nfake: line"), str(path))
    assert main(["import", str(path), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b[2J\\nfake: line" in out
    onnx.save(simple(relu_op="Op\x1b]0;title\x07"), str(path))
    assert main(["import", str(path), "--out", str(tmp_path / "out2")]) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "Op\\x1b]0;title\\x07" in err


def test_load_model_refuses_a_name_that_is_not_an_identifier(tmp_path):
    with pytest.raises(OnnxImportError, match="not a Python identifier"):
        load_model(tmp_path, name="../evil")


def test_an_unsupported_node_is_an_onnx_import_error():
    with pytest.raises(OnnxImportError) as info:
        convert(simple(relu_op="NoSuchOp"))
    assert isinstance(info.value, UnsupportedOnnxError)


# ------------------------------------------------------------- real exports' generated code
@pytest.fixture(scope="module")
def exported_sources(tmp_path_factory):
    """The generated modules of the torch-exported CNN and transformer encoder layer."""
    torch = pytest.importorskip("torch")
    from test_torch_export_cnn import _Cnn
    from test_torch_export_models import D_MODEL, SEQ, _Encoder

    sources = {}
    for name, net, shape in (("cnn", _Cnn(), (3, 12, 12)), ("encoder", _Encoder(), (SEQ, D_MODEL))):
        torch.manual_seed(0)
        path = tmp_path_factory.mktemp(name) / f"{name}.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(net.eval(), (torch.randn(2, *shape),), str(path), dynamo=False,
                              opset_version=17, input_names=["x"], output_names=["y"],
                              dynamic_axes={"x": {0: "batch"}})  # fmt: skip
        sources[name] = import_onnx(path, tmp_path_factory.mktemp(f"{name}_out"),
                                    name=name).code.read_text()  # fmt: skip
    return sources


@pytest.mark.parametrize("name", ["cnn", "encoder"])
def test_real_exports_generate_only_the_code_generator_s_vocabulary(exported_sources, name):
    source = exported_sources[name]
    assert generated_code_problems(source) == []
    tree = ast.parse(source)
    calls = {ast.unparse(n.func).split("(")[0] for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert calls  # the check saw the code it vouches for
    constants = {n.targets[0].id for n in tree.body if isinstance(n, ast.Assign)
                 and isinstance(n.targets[0], ast.Name)}  # fmt: skip
    assert {"GRAPH_NAME", "SOURCE", "PRODUCER", "OPSETS", "ONNX_INPUTS", "ONNX_OUTPUTS",
            "WEIGHTS", "RECORDER"} <= constants  # fmt: skip


@pytest.mark.parametrize("source", [
    "import os",
    "from os import system",
    "x = eval('1')",
    "x = getattr(a, 'b')",
    "x = a.__class__",
    "x = a.tofile('f')",
    "x = __import__('os')",
    "x = (lambda: 1)()",
])  # fmt: skip
def test_the_vocabulary_oracle_catches_what_it_must(source):
    assert generated_code_problems(source) != []


if __name__ == "__main__":  # the matrix's size, for the record
    print(dict(matrix_counts()), file=sys.stderr)
