"""What ember's own shape inference knows of a value, and the table of its rules.

A :class:`Fact` is what is known of one value before the model runs: its ONNX element
type, its shape (one :data:`~ember.onnx.ir.Dim` per axis, or None when even the rank is
unknown) and, for a small integer tensor (the shape arithmetic of exported models), its
elements. A rule is a function of a node's :class:`Site` (its attributes and the facts of
its inputs) giving the facts of its outputs; :func:`rule` registers one per op type, so
adding an op is registering its rule. A rule that cannot tell gives :data:`UNKNOWN`:
never a guess. :mod:`ember.onnx.infer` runs the rules over a graph.

Example:
    >>> a, b = Fact(1, ("n", 1, 4)), Fact(1, (3, 1))
    >>> broadcast_shapes([a.shape, b.shape])
    ('n', 3, 4)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.onnx.ir import Dim, Node, require_onnx

# ONNX element types the rules name.
FLOAT, INT64, BOOL = 1, 7, 9
INT_TYPES = frozenset({2, 3, 4, 5, 6, 7, 12, 13})
# The elements of integer tensors up to this size are tracked (shapes, axes, sizes).
MAX_VALUE = 64
# No tensor has more dims (NumPy's limit): a rank read from a model's numbers beyond it is
# not believed (nor allocated).
MAX_RANK = 64

Shape = tuple[Dim, ...]


@dataclass(frozen=True)
class Fact:
    """What is known of a value: element type (0: unknown), shape (None: unknown rank),
    and the elements of a small 0-d or 1-d integer tensor (None: unknown), each an int,
    a dim's name or None."""

    elem_type: int = 0
    shape: Shape | None = None
    value: tuple[Dim, ...] | None = None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def ints(self) -> list[int] | None:
        """The elements when every one is a known int, else None."""
        if self.value is None or not all(isinstance(v, int) for v in self.value):
            return None
        return list(self.value)  # type: ignore[arg-type]

    def with_shape(self, shape: Shape | None) -> Fact:
        return Fact(self.elem_type, shape)


UNKNOWN = Fact()


def elem_type_of(dtype: Any) -> int:
    """The ONNX element type of a NumPy dtype (0 when ONNX has none)."""
    onnx = require_onnx()
    try:
        return int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    except (KeyError, TypeError, ValueError):
        return 0


def fact_of_array(array: np.ndarray) -> Fact:
    """The fact of a constant: its type and shape, and its elements when it is a small
    integer tensor."""
    elem = elem_type_of(array.dtype)
    value = None
    if elem in INT_TYPES and array.ndim <= 1 and array.size <= MAX_VALUE:
        value = tuple(int(v) for v in array.reshape(-1))
    return Fact(elem, tuple(int(d) for d in array.shape), value)


# ------------------------------------------------------------------------------ dims
def known(dims: Iterable[Dim]) -> bool:
    """Whether every dim is a known size."""
    return all(isinstance(d, int) for d in dims)


def product(dims: Sequence[Dim]) -> int | None:
    """The product of the dims when all are known sizes."""
    if not known(dims):
        return None
    total = 1
    for d in dims:
        total *= d  # type: ignore[operator]
    return total


def same_dim(first: Dim, second: Dim) -> Dim:
    """One dim told twice (by ONNX and by a rule, both true): a size over a name over
    nothing; ``first`` when both are sizes or names."""
    if isinstance(first, int):
        return first
    if isinstance(second, int):
        return second
    return first if first is not None else second


def join_dim(a: Dim, b: Dim) -> Dim:
    """A dim that is ``a`` or ``b`` (the outputs of two branches): known only if equal."""
    return a if a == b else None


def broadcast_dim(a: Dim, b: Dim) -> Dim:
    """The dim NumPy broadcasting gives of ``a`` and ``b``; None when it cannot tell."""
    if a == 1:
        return b
    if b == 1:
        return a
    if a == b:
        return a
    if isinstance(a, int) and isinstance(b, int):
        return None  # sizes that do not broadcast: a malformed model, nothing to tell
    # A size above 1 against anything else: the other is 1 or the same size.
    if isinstance(a, int):
        return a
    if isinstance(b, int):
        return b
    return None


def broadcast_shapes(shapes: Sequence[Shape | None]) -> Shape | None:
    """The shape of NumPy broadcasting ``shapes``; None when a rank is unknown."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)  # type: ignore[arg-type]
    out: list[Dim] = [1] * rank
    for shape in shapes:
        padded = [1] * (rank - len(shape)) + list(shape)  # type: ignore[arg-type]
        out = [broadcast_dim(a, b) for a, b in zip(out, padded)]
    return tuple(out)


def merge(told: Fact, inferred: Fact) -> Fact:
    """One value's fact from ONNX's inference (``told``) and a rule's (``inferred``): what
    ONNX tells stands (a different rank keeps ONNX's), the rule fills in the rest."""
    elem = told.elem_type or inferred.elem_type
    shape = told.shape
    if shape is None:
        shape = inferred.shape
    elif inferred.shape is not None and len(inferred.shape) == len(shape):
        shape = tuple(same_dim(a, b) for a, b in zip(shape, inferred.shape))
    value = told.value if told.value is not None else inferred.value
    return Fact(elem, shape, value)


def join(a: Fact, b: Fact) -> Fact:
    """A value that is ``a`` or ``b``: what both tell alike."""
    elem = a.elem_type if a.elem_type == b.elem_type else 0
    shape = None
    if a.shape is not None and b.shape is not None and len(a.shape) == len(b.shape):
        shape = tuple(join_dim(x, y) for x, y in zip(a.shape, b.shape))
    value = a.value if a.value == b.value else None
    return Fact(elem, shape, value)


def fits(fact: Fact, bound: Fact) -> bool:
    """Whether every value ``fact`` describes is one ``bound`` describes."""
    if bound.elem_type and fact.elem_type != bound.elem_type:
        return False
    if bound.shape is not None:
        if fact.shape is None or len(fact.shape) != len(bound.shape):
            return False
        if any(b is not None and a != b for a, b in zip(fact.shape, bound.shape)):
            return False
    return bound.value is None or fact.value == bound.value


def axis_of(axis: int, rank: int) -> int | None:
    """A possibly negative axis in ``[0, rank)``; None when out of range."""
    if not -rank <= axis < rank:
        return None
    return axis + rank if axis < 0 else axis


# ------------------------------------------------------------------------------ rules
class Site:
    """A node as its rule sees it: attributes, the opset, and the facts of its inputs.

    ``body`` infers one of its subgraphs (If, Loop, Scan) from the facts of the
    subgraph's inputs and gives the facts of its outputs.
    """

    def __init__(self, node: Node, opset: int, inputs: Sequence[Fact],
                 body: Callable[[Any, Sequence[Fact]], list[Fact]]) -> None:  # fmt: skip
        self.node = node
        self.opset = opset
        self._inputs = list(inputs)
        self._body = body

    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    @property
    def num_outputs(self) -> int:
        return len(self.node.outputs)

    def present(self, index: int) -> bool:
        return index < len(self.node.inputs) and bool(self.node.inputs[index])

    def input(self, index: int) -> Fact:
        """The fact of input ``index``; :data:`UNKNOWN` when absent."""
        return self._inputs[index] if self.present(index) else UNKNOWN

    def attr(self, name: str, default: Any = None) -> Any:
        return self.node.attrs.get(name, default)

    def ints_attr(self, name: str) -> list[int] | None:
        value = self.attr(name)
        if value is None:
            return None
        return [int(v) for v in np.asarray(value).reshape(-1)]

    def body(self, attr: str, inputs: Sequence[Fact]) -> list[Fact]:
        """The facts of the outputs of subgraph ``attr`` given its inputs' facts."""
        proto = self.attr(attr)
        if type(proto).__name__ != "GraphProto":
            raise ValueError(f"attribute {attr!r} is not a graph")
        return self._body(proto, inputs)


Rule = Callable[[Site], Sequence[Fact] | Fact]

RULES: dict[str, Rule] = {}


def rule(*op_types: str) -> Callable[[Rule], Rule]:
    """Registers the decorated function as the rule of ``op_types`` (default ONNX domain).

    A rule returns one fact per output (or one fact for a single output); missing
    trailing outputs are unknown.
    """

    def register(fn: Rule) -> Rule:
        for op in op_types:
            if op in RULES:
                raise ValueError(f"a shape rule for {op} is registered twice")
            RULES[op] = fn
        return fn

    return register
