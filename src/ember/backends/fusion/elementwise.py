"""The element-wise fuser: chains of element-wise ops with broadcasting, as one block.

It takes the op-table groups ``binary``, ``scalar``, ``unary``, ``compare`` and
``select``, and ``cast``, on any kind, as long as every register broadcasts against the
block's shape (operands of a lower rank get leading unit dims, as NumPy does) and every
result fills it (only the reduced axis may be 1): a smaller result, such as a bias's
optimizer update beside its weight's, would be computed again at every position. With
``reduce=True`` it also takes the reductions of ``ir.REDUCTIONS`` over one axis (the
block's ``axis``; every reduction of a block reduces the same one), and element-wise ops
after them: softmax, layer norm and mean/var are one block each. With ``totals=True`` too,
a block reducing its last dim also takes totals (``ir.is_total``): float sums over one
other dim of values of its full shape on the CPU, which no later record of the block reads
(a layer norm's gradient and its weight's and bias's sums over the batch).

Example:
    >>> import ember
    >>> from ember import Tensor
    >>> from ember.backends.fusion import reset_stats, stats
    >>> reset_stats()
    >>> x = Tensor.from_data([[1.0, 2.0]], ember.device("ndarray").fusion())
    >>> ((x * 2.0 + 1.0).exp() > 3.0).tolist()
    [[True, True]]
    >>> stats()["kernels"], stats()["fused_ops"]
    (1, 4)
"""

from __future__ import annotations

from ember.backend.ops import OPS
from ember.backends.fusion.fuser import Fused, Properties, Status, Taking
from ember.backends.fusion.handle import Slot
from ember.backends.fusion.ir import REDUCTIONS, Block, Input, Instr, StateError
from ember.backends.fusion.stream import MAX_RECORDS, Record
from ember.tensor.dtype import DType

GROUPS = frozenset({"binary", "scalar", "unary", "compare", "select"})
"""The op-table groups the fuser takes (plus ``cast``)."""

NUMPY_DTYPES = frozenset(d for d in DType if d.name not in ("BF16",))
"""Dtypes a NumPy array (so a runtime) can hold."""


MAX_RANK = 64
"""The highest block rank a stored template may claim."""


def elementwise(record: Record) -> bool:
    """Whether ``record`` is an element-wise op the fuser may take."""
    return record.op.group in GROUPS or record.op.name == "cast"


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b, strict=True):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(out)


class ElementwiseFuser(Taking):
    """Takes element-wise records (and, with ``reduce``, reductions over one axis).

    Args:
        can_fuse: whether a slot's values can reach a runtime (a NumPy-viewable CPU tensor).
        reduce: also take reductions over one axis.
        totals: with ``reduce``, also take totals (a runtime that computes them: numba's,
            the interpreter).
    """

    def __init__(self, can_fuse, reduce: bool = False, totals: bool = False) -> None:
        self.sums_totals = reduce and totals
        # A name of its own: plan keys hold the fusers' names, and its plans differ.
        self.name = "elementwise+totals" if self.sums_totals else (
            "elementwise+reduce" if reduce else "elementwise")  # fmt: skip
        self.can_fuse = can_fuse
        self.reduce = reduce
        self.reset()

    def reset(self) -> None:
        self.records: list[Record] = []
        self.shape: tuple[int, ...] = ()
        self.axis: int | None = None  # counted from the end, so lower ranks agree
        self.totals: dict[int, int] = {}  # a total's slot id -> its summed dim, from the end
        self._status = Status.OPEN

    def properties(self) -> Properties:
        n = len(self.records)
        return Properties(score=n, ready=n > 0)

    def might_take(self, record: Record) -> bool:
        if record.multi:
            return False
        return elementwise(record) or (self.reduce and record.op.name in REDUCTIONS)

    def fuse(self, record: Record) -> None:
        if self._status is Status.CLOSED:
            return
        if not self._takes(record):
            self._status = Status.CLOSED
            return
        self.records.append(record)

    def _takes(self, record: Record) -> bool:
        slots = (*record.inputs, *record.outputs)
        if not all(s.dtype in NUMPY_DTYPES and self.can_fuse(s) for s in slots):
            return False
        if record.multi:
            return False
        if self.totals and any(s.id in self.totals for s in record.inputs):
            return False  # a total is complete after the kernel only
        axis = self.axis
        if record.op.name in REDUCTIONS:
            if not self.reduce:
                return False
            x = record.inputs[0]
            dim = record.args[1]
            rank = len(x.shape)
            dim = dim + rank if dim < 0 else dim
            here = dim - rank  # from the end
            if axis is not None and axis != here:
                return self._takes_total(record, here)
            axis = here
        elif not elementwise(record):
            return False
        shape = self.shape
        for s in slots:
            shape = _broadcast(shape, s.shape)
            if shape is None:
                return False
        if self.records and shape != self.shape:
            return False  # the records taken so far would be computed again for each new row
        if not self._fills(record.outputs[0].shape, shape, axis):
            return False  # a smaller result would be computed once per position of the block
        self.shape, self.axis = shape, axis
        return True

    def _takes_total(self, record: Record, here: int) -> bool:
        """Takes ``record``, a reduction over dim ``here`` (from the end) of a block that
        reduces another, where it is a total (``ir.is_total``) the runtime computes: a
        float ``sum_dim`` on the CPU of a value of the block's full shape, the block's axis
        its last dim, ``here`` not a unit dim and the dim of the block's other totals.
        Another dim of more than one position must remain: the kernel's parallel tasks are
        its positions (a ``[rows, D]`` block summed over its rows would run on one thread)."""
        x, out = record.inputs[0], record.outputs[0]
        rank = len(self.shape)
        if (not self.sums_totals or record.op.name != "sum_dim" or self.axis != -1
                or x.dtype not in (DType.F32, DType.F64) or out.dtype != x.dtype
                or x.device.place != "cpu" or _pad(x.shape, rank) != self.shape
                or self.shape[rank + here] == 1
                or any(d != here for d in self.totals.values())
                or all(n == 1 for n in self.shape[: rank + here] + self.shape[rank + here + 1 : -1])):  # fmt: skip
            return False
        self.totals[out.id] = here
        return True

    @staticmethod
    def _fills(out: tuple[int, ...], shape: tuple[int, ...], axis: int | None) -> bool:
        """Whether a result of shape ``out`` has the block's shape, but for the reduced axis."""
        out = _pad(out, len(shape))
        return all(o == d or (i - len(shape) == axis and o == 1)
                   for i, (o, d) in enumerate(zip(out, shape)))  # fmt: skip

    def finish(self, keep: set[int]) -> Fused:
        rank = len(self.shape)
        produced = {o.id for r in self.records for o in r.outputs}
        registers: dict[int, int] = {}  # slot id -> register
        inputs: list[Slot] = []
        for record in self.records:  # registers 0..n-1: the slots made before the block
            for s in record.inputs:
                if s.id not in produced and s.id not in registers:
                    registers[s.id] = len(inputs)
                    inputs.append(s)
        body: list[Instr] = []
        outputs: list[int] = []
        out_slots: list[Slot] = []
        for record in self.records:
            args = tuple(registers[s.id] for s in record.inputs)
            attrs = tuple(record.args[len(record.op.inputs) :])
            out = record.outputs[0]
            if record.op.name in REDUCTIONS:
                attrs = (rank + self.totals.get(out.id, self.axis),)
            registers[out.id] = len(inputs) + len(body)
            body.append(Instr(record.op.name, args, attrs, _pad(out.shape, rank), out.dtype))
            if out.id in keep:
                outputs.append(registers[out.id])
                out_slots.append(out)
        block = Block(
            shape=self.shape,
            inputs=tuple(Input(_pad(s.shape, rank), s.dtype) for s in inputs),
            body=tuple(body),
            outputs=tuple(outputs),
            axis=None if self.axis is None else rank + self.axis,
        )
        return Fused(block, tuple(inputs), tuple(out_slots))

    def template(self, fused: Fused) -> Template:
        """``fused`` (this fuser's :meth:`finish` of its records) in relative form."""
        rank = len(self.shape)
        return Template(fused, self.records, rank, None if self.axis is None else rank + self.axis)


def _pad(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    return (1,) * (rank - len(shape)) + shape


class Template:
    """A block in relative form: what :meth:`ElementwiseFuser.finish` made for a segment,
    with every slot named by its position in the segment (record, input or output index)
    rather than its id, and without sizes. A stream with the same plan key (same ops,
    sources, dtypes, ranks, unit dims, reduced axes and readable outputs) gives the same
    block but for the sizes, so a plan-cache hit binds it (:meth:`bind`) instead of
    running the fuser again.
    """

    __slots__ = ("_last", "axis", "block_key", "body", "inputs", "out_positions", "outputs",
                 "rank")  # fmt: skip

    def __init__(self, fused: Fused, records: list[Record], rank: int, axis: int | None) -> None:
        where: dict[int, tuple[int, int]] = {}  # slot id -> (record offset, input index)
        for j, record in enumerate(records):
            for k, s in enumerate(record.inputs):
                where.setdefault(s.id, (j, k))
        self.rank = rank
        self.axis = axis
        self.inputs = tuple(where[s.id] for s in fused.inputs)
        # per record: (op name, argument registers, the fixed attrs of a reduction or None)
        self.body = tuple(
            (i.op, i.args, i.attrs if i.op in REDUCTIONS else None) for i in fused.block.body
        )
        self.outputs = fused.block.outputs
        first = len(fused.inputs)
        self.out_positions = tuple(r - first for r in fused.block.outputs)  # record offsets
        self.block_key = fused.block.key()  # every block it binds has this pattern
        self._last: tuple | None = None  # (shape, varying attrs, block) of the last bind

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Template):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # mutable slots: equal templates need not hash alike

    def _fields(self) -> tuple:
        return (self.rank, self.axis, self.inputs, self.body, self.outputs)

    def to_state(self) -> dict:
        """The template as plain data (ints, strings, lists; ops by table name)."""
        return {
            "rank": self.rank,
            "axis": self.axis,
            "inputs": [list(p) for p in self.inputs],
            "body": [
                [op, list(args), None if fixed is None else list(fixed)]
                for op, args, fixed in self.body
            ],
            "outputs": list(self.outputs),
        }

    @classmethod
    def from_state(cls, state: object) -> Template:
        """The template :meth:`to_state` made, checked to be one the fuser could have made.

        Everything is checked before anything is built: ``rank`` in ``0 ..`` :data:`MAX_RANK`,
        each instruction an op of the groups the fuser takes (or a reduction over ``axis``,
        which then lies in the rank) with the op table's number of operands, each reading
        only earlier registers; each input names a record and operand whose instruction
        reads exactly that input's register; outputs are distinct body registers in order.
        It says nothing about which records the template fits: whoever binds a template
        from disk compares it with the fuser's own for the records first.

        Raises:
            StateError: naming what is wrong.
        """
        if type(state) is not dict or set(state) != {"rank", "axis", "inputs", "body", "outputs"}:
            raise StateError("a template is a dict of rank, axis, inputs, body and outputs")
        rank, axis = state["rank"], state["axis"]
        if type(rank) is not int or not 0 <= rank <= MAX_RANK:
            raise StateError(f"template rank {rank!r} is not an int in 0..{MAX_RANK}")
        if axis is not None and (type(axis) is not int or not 0 <= axis < rank):
            raise StateError(f"template axis {axis!r} is not a dim of rank {rank}")
        raw_body, raw_inputs, raw_outputs = state["body"], state["inputs"], state["outputs"]
        if type(raw_body) is not list or not 1 <= len(raw_body) <= MAX_RECORDS:
            raise StateError(f"a template body is a list of 1..{MAX_RECORDS} instructions")
        if type(raw_inputs) is not list or len(raw_inputs) > 3 * len(raw_body):
            raise StateError("template inputs are a list of at most 3 per instruction")
        n_inputs = len(raw_inputs)
        body = []
        reduces = False
        for i, entry in enumerate(raw_body):
            if type(entry) is not list or len(entry) != 3:
                raise StateError(f"instruction {i} is not [op, args, fixed attrs]")
            op, args, fixed = entry
            if type(op) is not str or op not in _TAKEN:
                raise StateError(f"instruction {i}: {op!r} is no op the fuser takes")
            arity = len(OPS[op].inputs)
            if type(args) is not list or len(args) != arity:
                raise StateError(f"instruction {i}: {op} takes {arity} registers")
            for a in args:
                if type(a) is not int or not 0 <= a < n_inputs + i:
                    raise StateError(f"instruction {i} reads register {a!r}, not an earlier one")
            if op in REDUCTIONS:
                total = (op == "sum_dim" and axis == rank - 1 and type(fixed) is list
                         and len(fixed) == 1 and type(fixed[0]) is int and 0 <= fixed[0] < axis)  # fmt: skip
                if axis is None or not ((fixed == [axis] and type(fixed[0]) is int) or total):
                    raise StateError(f"instruction {i}: a reduction's attrs must be [{axis}], "
                                     "or a dim before the last for a total (sum_dim)")  # fmt: skip
                reduces, fixed = True, tuple(fixed)
            elif fixed is not None:
                raise StateError(f"instruction {i}: {op} has no fixed attrs")
            body.append((op, tuple(args), fixed))
        if reduces != (axis is not None):
            raise StateError("a template has an axis exactly when it reduces")
        inputs = []
        for r, entry in enumerate(raw_inputs):
            if type(entry) is not list or len(entry) != 2:
                raise StateError(f"input {r} is not [record, operand]")
            j, k = entry
            if type(j) is not int or type(k) is not int or not 0 <= j < len(body):
                raise StateError(f"input {r} names record {j!r} of {len(body)}")
            if not 0 <= k < len(body[j][1]) or body[j][1][k] != r:
                raise StateError(f"input {r}: record {j}'s operand {k!r} is not register {r}")
            inputs.append((j, k))
        first, end = n_inputs, n_inputs + len(body)
        if type(raw_outputs) is not list or not all(type(o) is int for o in raw_outputs):
            raise StateError("template outputs are a list of registers")
        if any(not first <= o < end for o in raw_outputs) or raw_outputs != sorted(
            set(raw_outputs)
        ):
            raise StateError(f"template outputs must be distinct registers in {first}..{end - 1}")
        template = cls.__new__(cls)
        template.rank, template.axis = rank, axis
        template.inputs, template.body = tuple(inputs), tuple(body)
        template.outputs = tuple(raw_outputs)
        template.out_positions = tuple(o - first for o in raw_outputs)
        template.block_key = None  # from its first bound block
        template._last = None
        return template

    def bind(self, records: list[Record]) -> Fused | None:
        """The block for ``records`` (a segment with this template's plan key), or None
        when their sizes do not agree on one block shape (the fuser would not take them)."""
        rank = self.rank
        shape = [1] * rank
        # Most slots of a block share a few shapes: check each distinct one once.
        distinct = {s.shape for r in records for s in r.inputs} | {
            s.shape for r in records for s in r.outputs
        }
        for slot_shape in distinct:
            offset = rank - len(slot_shape)
            for d, size in enumerate(slot_shape):
                if size != 1:
                    have = shape[offset + d]
                    if have == 1:
                        shape[offset + d] = size
                    elif have != size:
                        return None
        inputs = tuple([records[j].inputs[k] for j, k in self.inputs])
        outs = tuple([records[j].outputs[0] for j in self.out_positions])
        shape = tuple(shape)
        # The plan key fixes every slot's rank, unit dims and dtype, so the block's shape
        # gives every size: the last block is this one where its scalars are the same too.
        varying = tuple([tuple(record.args[len(record.op.inputs) :])
                         for record, (_, _, fixed) in zip(records, self.body, strict=True)
                         if fixed is None])  # fmt: skip
        last = self._last
        if last is not None and last[0] == shape and _same_values(last[1], varying):
            return Fused(last[2], inputs, outs)
        body = []
        attrs_of = iter(varying)
        for record, (op, args, fixed) in zip(records, self.body, strict=True):
            out = record.outputs[0]
            attrs = fixed if fixed is not None else next(attrs_of)
            body.append(Instr(op, args, attrs, _pad(out.shape, rank), out.dtype))
        block = Block(
            shape=shape,
            inputs=tuple(Input(_pad(s.shape, rank), s.dtype) for s in inputs),
            body=tuple(body),
            outputs=self.outputs,
            axis=self.axis,
        )
        if self.block_key is None:
            self.block_key = block.key()
        else:
            block.share_key(self.block_key)
        self._last = (shape, varying, block)
        return Fused(block, inputs, outs)


def _same_values(a: tuple, b: tuple) -> bool:
    """Whether two tuples of attribute tuples hold the same values: equal and of the same
    types, element by element (``1 == 1.0 == True``, and ``0.0 == -0.0`` though a product
    by each differs in sign)."""
    if a == b:
        for x, y in zip(a, b):
            for u, v in zip(x, y):
                if type(u) is not type(v) or (u == 0 and type(u) is float and str(u) != str(v)):
                    return False
        return True
    return False


_TAKEN = (
    frozenset(name for name, op in OPS.items() if op.group in GROUPS or name == "cast") | REDUCTIONS
)
"""Op-table names a template's instructions may hold: what :func:`elementwise` takes, and
the reductions."""
