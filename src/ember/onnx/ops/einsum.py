"""Einsum, as permutes, reshapes, sums and batched matrix products.

The equation is parsed at import time and the generated code is plain tensor ops:

1. a letter repeated inside one operand (``ii``) takes the diagonal: the two dims move
   to the end, merge, and every ``n + 1``-th element is selected;
2. a letter that only one operand has and the output lacks is summed out;
3. the operands are combined left to right: the letters both have and something later
   needs are batch dims, those nothing later needs are contracted; each pair becomes
   one ``[batch, rows, inner] @ [batch, inner, cols]`` product;
4. the result is permuted into the output's order.

An ellipsis (``...``) stands for the leading dims an operand has beyond its letters;
it broadcasts across operands as in NumPy, which needs the sizes of dims that broadcast
(size 1 against n) to be known at import time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ember.onnx.context import NodeContext, Value
from ember.onnx.registry import converter

Size = int | str  # a size known at import time, or the expression of one


@dataclass
class _Operand:
    """An operand as the generated code holds it: an expression and a label per dim."""

    expr: str
    labels: list[str]
    sizes: list[Size] = field(default_factory=list)


def _split_term(node: NodeContext, term: str) -> tuple[list[str], bool]:
    """The letters of one term, with ``"..."`` as one item where the ellipsis is."""
    labels: list[str] = []
    rest, ellipsis = term, False
    while rest:
        if rest.startswith("..."):
            if ellipsis:
                node.unsupported(f"the equation's term {term!r} has two ellipses")
            labels.append("...")
            ellipsis, rest = True, rest[3:]
        elif rest[0].isascii() and rest[0].isalpha():
            labels.append(rest[0])
            rest = rest[1:]
        else:
            node.unsupported(f"the equation's term {term!r} has the character {rest[0]!r}; "
                             f"Einsum terms hold letters and at most one '...'")
    return labels, ellipsis


def _ellipsis_labels(count: int, width: int) -> list[str]:
    """Labels of an operand's ``count`` ellipsis dims among ``width``: aligned on the right,
    as broadcasting does (digits never clash with the letters)."""
    return [str(i) for i in range(width - count, width)]


def _parse(node: NodeContext, inputs: list[Value]) -> tuple[list[list[str]], list[str]]:
    """Each operand's label per dim, and the output's labels."""
    equation = str(node.attr("equation")).replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(inputs):
        node.unsupported(f"the equation {equation!r} has {len(terms)} operands for "
                         f"{len(inputs)} inputs")
    parsed = [_split_term(node, t) for t in terms]
    counts = []
    for (labels, ellipsis), value in zip(parsed, inputs):
        letters = len(labels) - ellipsis
        if value.rank is None:
            if ellipsis:
                node.unsupported("an ellipsis needs the operand's rank; run ONNX shape "
                                 "inference or give the inputs static ranks")
            counts.append(0)
            continue
        if value.rank < letters or (not ellipsis and value.rank != letters):
            node.unsupported(f"the equation's term {''.join(labels)!r} does not fit an operand of rank "
                             f"{value.rank}")
        counts.append(value.rank - letters)
    width = max(counts, default=0)
    operands = []
    for (labels, _), count in zip(parsed, counts):
        expanded: list[str] = []
        for label in labels:
            expanded += _ellipsis_labels(count, width) if label == "..." else [label]
        operands.append(expanded)
    if arrow:
        out_labels, _ = _split_term(node, rhs)
        output: list[str] = []
        for label in out_labels:
            output += _ellipsis_labels(width, width) if label == "..." else [label]
        known = {label for labels in operands for label in labels}
        unknown = [label for label in output if label not in known]
        if unknown or len(set(output)) != len(output):
            node.unsupported(f"the equation's output term {rhs!r} repeats a letter or has letters no "
                             f"operand has")
    else:
        # Implicit output: the ellipsis dims, then the letters used once, alphabetically.
        letters = [label for labels in operands for label in labels if label.isalpha()]
        output = _ellipsis_labels(width, width) + sorted(
            {c for c in letters if letters.count(c) == 1})
    return operands, output


def _product(sizes: list[Size]) -> Size:
    """The product of sizes: a number when all are known, else an expression."""
    if all(isinstance(s, int) for s in sizes):
        return math.prod(sizes)  # type: ignore[arg-type]
    return " * ".join(str(s) for s in sizes if s != 1)


def _shape_literal(sizes: list[Size]) -> str:
    return "[" + ", ".join(str(s) for s in sizes) + "]"


def _permuted(op: _Operand, order: list[str]) -> str:
    """``op``'s expression with its dims in the label ``order``."""
    perm = [op.labels.index(label) for label in order]
    return op.expr if perm == list(range(len(perm))) else f"{op.expr}.permute({perm})"


class _Builder:
    """Emits the lines of one Einsum node into fresh locals."""

    def __init__(self, node: NodeContext) -> None:
        self.node = node
        self.lines: list[str] = []

    def assign(self, expr: str, hint: str = "t") -> str:
        name = self.node.tmp(hint)
        self.lines.append(f"{name} = {expr}")
        return name

    def diagonal(self, op: _Operand) -> _Operand:
        """Takes the diagonal of every letter the operand repeats."""
        while len(set(op.labels)) != len(op.labels):
            label = next(lb for lb in op.labels if op.labels.count(lb) > 1)
            first = op.labels.index(label)
            second = op.labels.index(label, first + 1)
            rest = [i for i in range(len(op.labels)) if i not in (first, second)]
            n = op.sizes[first]
            perm = [*rest, first, second]
            source = op.expr if perm == sorted(perm) else f"{op.expr}.permute({perm})"
            sizes = [op.sizes[i] for i in rest]
            merged = _shape_literal([*sizes, _product([n, n])])
            step = n + 1 if isinstance(n, int) else f"{n} + 1"
            expr = (f"{source}.reshape({merged}).select(-1, Tensor.arange(0, {_product([n, n])}, "
                    f"{step}, device={op.expr}.device))")
            op = _Operand(self.assign(expr, "diagonal"), [op.labels[i] for i in rest] + [label],
                          [*sizes, n])
        return op

    def sum_out(self, op: _Operand, labels: list[str]) -> _Operand:
        if not labels:
            return op
        dims = [op.labels.index(label) for label in labels]
        expr = op.expr + "".join(f".sum_dim({d})" for d in dims) + f".squeeze_dims({dims})"
        keep = [i for i in range(len(op.labels)) if i not in dims]
        return _Operand(self.assign(expr, "summed"), [op.labels[i] for i in keep],
                        [op.sizes[i] for i in keep])

    def grouped(self, op: _Operand, groups: list[list[str]], sizes: dict[str, Size]) -> str:
        """``op`` permuted into the label groups and reshaped to one dim per group; the
        dims of size 1 that broadcast against a larger size are expanded first."""
        order = [label for group in groups for label in group]
        expr = _permuted(op, order)
        own = [op.sizes[op.labels.index(label)] for label in order]
        full = [sizes[label] for label in order]
        if own != full:
            expr = f"{expr}.expand({_shape_literal(full)})"
        if any(len(group) != 1 for group in groups):
            merged = [_product([sizes[label] for label in group]) for group in groups]
            expr = f"{expr}.reshape({_shape_literal(merged)})"
        return expr

    def combine(self, a: _Operand, b: _Operand, needed: set[str]) -> _Operand:
        """One product of two operands; letters outside ``needed`` are contracted."""
        sizes = self.sizes(a, b)
        batch = [x for x in a.labels if x in b.labels and x in needed]
        inner = [x for x in a.labels if x in b.labels and x not in needed]
        rows = [x for x in a.labels if x not in b.labels]
        cols = [x for x in b.labels if x not in a.labels]
        groups_a = [batch, rows, inner] if batch else [rows, inner]
        groups_b = [batch, inner, cols] if batch else [inner, cols]
        product = f"{self.grouped(a, groups_a, sizes)}.matmul({self.grouped(b, groups_b, sizes)})"
        labels = batch + rows + cols
        out_sizes = [sizes[x] for x in labels]
        if any(len(group) != 1 for group in ([batch, rows, cols] if batch else [rows, cols])):
            product = f"{product}.reshape({_shape_literal(out_sizes)})"
        return _Operand(self.assign(product, "product"), labels, out_sizes)

    def sizes(self, a: _Operand, b: _Operand) -> dict[str, Size]:
        """The size of every label of ``a`` and ``b``, broadcasting 1 against n."""
        out: dict[str, Size] = {}
        for op in (a, b):
            for label, size in zip(op.labels, op.sizes):
                known = out.get(label)
                if known is None or known == 1:
                    out[label] = size
                elif size not in (1, known) and isinstance(size, int) and isinstance(known, int):
                    self.node.unsupported(f"the dims labelled {label!r} have sizes {known} and "
                                          f"{size}")
        return out


def _sizes(value: Value) -> list[Size]:
    shape = value.shape or ()
    if value.rank is None:
        return []
    return [d if isinstance(d, int) else f"{value.expr}.shape[{i}]"
            for i, d in enumerate(shape)]  # fmt: skip


@converter("Einsum", since=12, attrs=("equation",),
           limits="ellipsis dims that broadcast (size 1 against n) need static sizes")
def einsum(node: NodeContext) -> list[str]:
    inputs = node.inputs
    labels, output = _parse(node, inputs)
    build = _Builder(node)
    operands = []
    for value, own in zip(inputs, labels):
        if value.rank is None:
            node.unsupported("Einsum needs the rank of every operand; run ONNX shape inference")
        operands.append(build.diagonal(_Operand(value.expr, own, _sizes(value))))
    # A letter only one operand has, and the output lacks, is summed right away.
    for i, op in enumerate(operands):
        others = {x for j, o in enumerate(operands) if j != i for x in o.labels}
        operands[i] = build.sum_out(op, [x for x in op.labels if x not in others
                                         and x not in output])
    result = operands[0]
    for i in range(1, len(operands)):
        needed = set(output) | {x for op in operands[i + 1 :] for x in op.labels}
        result = build.combine(result, operands[i], needed)
    result = build.sum_out(result, [x for x in result.labels if x not in output])
    final = _permuted(result, output)
    last = build.lines[-1] if build.lines else ""
    if last.startswith(f"{final} = "):
        # The last local is the output as it is: assign the output directly.
        build.lines[-1] = f"{node.outputs[0]} = {last.removeprefix(f'{final} = ')}"
    else:
        build.lines.append(f"{node.outputs[0]} = {final}")
    return build.lines
