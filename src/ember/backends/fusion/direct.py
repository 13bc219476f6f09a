"""A replay without records: the launches of a trace's flush, kept and run on the arrays.

A replayed call (``replayed.py``) pushes its trace's records into the stream, and the
stream's flush plans, binds and launches them: Python that a small model pays on every
call, and pays cold, since each kernel before it streamed its data through the caches (a
replayed layer norm's call at two threads spent 240 us of Python around a 0.8 ms kernel).
A replay of up to ``stream.MAX_REPLAY_RECORDS`` records pushes them all before its stream
runs. Where the first replay's flush held exactly the records it pushed, :func:`learn`
keeps the flush's launches as a :class:`Program`, with each value named by its trace
reference; later calls :func:`run` it on the input arrays at once:

* ``op``, first: each entry the replay ran at once (a small op on made values: it reads
  only inputs, constants and the others' results), by ``Executor.run_single``;
* ``block``: an element-wise block (``Fused``), launched on the runtime as the executor's
  ``_launch`` does, with the tuner's settled choice;
* ``conv``: a convolution with its epilogue (``ConvEpilogue``) or alone, launched on the
  numba kernel at the tuner's settled thread count, as ``_conv_epilogue`` and
  ``_run_op_kernel`` do;
* ``attention``: an attention or attention gradient segment, its template bound to records
  made for it and run by the executor's own method, in the layout its readers had; where
  one cat joins a gradient's three results through layout ops (self-attention's packed
  projection), the kernel writes them as views of one pooled array laid out as the cat's
  result (``_Made._gather``);
* ``joined``: that cat, a view of the array its pieces lie side by side in (copying 6 MB
  of ``nn_step``'s gradients took 1 ms a layer), or a plain cat where they lie apart;
* ``kernel``: an op with a compiled kernel (``op_kernels``: a product, a pooling, a
  convolution's gradient), launched at the tuner's settled choice on the arrays themselves
  (``_Made._kernel``), else run as an ``op``;
* ``product``: a product and its bias (``BiasedMatmulFuser``), launched the same way on the
  GEMM with the bias, else the two run one by one as ``kernel`` and ``op`` (records where
  a choice is pending: ``Executor.run_biased`` times it);
* ``accumulate``: a product and the addition that takes it into a value at its last use
  (``executor.accumulations``), run by ``Executor.run_accumulated`` where the values
  allow, else as the two records;
* ``transposed``: a product whose one reader swaps it, computed transposed as the
  executor does (``Executor.run_transposed``);
* ``view``: a layout op (``views.VIEW_OPS``), run on the inner backend at once where it
  gives a view (else as an ``op``);
* ``op``: any other single op (the mean of a global pooling, a bias gradient's sum), run
  as the inner op on the arrays where ``Executor.run_single`` would run that op
  (``_Made._inner``), else by ``run_single`` on a record made for it.

After each step, the values no later step reads and the call does not return are
dropped, so their buffers go back to the pool for the steps after it. The outputs are
made when the call returns, so ops after the call no longer fuse with its last block.
:func:`run` hands the call back to the records (returns None) where they must run: an
input still pending, a block the tuner has not settled or runs unfused, plans forgotten
since the program was made (``Explorer.generation``); where a launch is refused or was
never the kernel's (too small to time), or a template no longer binds, the program is
dropped for good. An indexed op's indices (a classifier's labels) are checked after the
entries run at once and before any other step, where the records would check them; random
ops draw in the order the records would. A product's epilogue (Triton) and traces with
eager ops keep the records.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

from ember.backend.device import Device
from ember.backend.errors import UnsupportedError
from ember.backend.kept import immutable
from ember.backends.fusion import autotune, counters, joins
from ember.backends.fusion.attention import Attention
from ember.backends.fusion.attention_grad import AttentionGrad
from ember.backends.fusion.conv_epilogue import ConvEpilogue
from ember.backends.fusion.executor import (
    accumulations,
    addend,
    check_output,
    read_transposed,
    reader_layout,
    readers_of,
    runs_inner,
)
from ember.backends.fusion.explorer import Explorer
from ember.backends.fusion.fuser import Fused
from ember.backends.fusion.handle import Slot, indices_fit
from ember.backends.fusion.matmul_epilogue import MatmulEpilogue
from ember.backends.fusion.op_kernels import matmul_with_bias
from ember.backends.fusion.stream import Record
from ember.backends.fusion.views import VIEW_OPS

_NO_BOUNDS = (None, None)


class Program:
    """A trace's flush as launches (see the module doc): ``steps`` in order, each a tuple
    whose first item names its kind; ``generation`` the explorer's when it was made."""

    __slots__ = ("blocks", "bound", "device", "drops", "first", "generation", "hows",
                 "indexed", "launches", "op_keys", "steps")  # fmt: skip

    def __init__(self, generation: int, steps: tuple, device: Device,
                 drops: tuple[tuple[int, ...], ...], indexed: tuple[int, ...] = (),
                 first: int = 0) -> None:  # fmt: skip
        self.generation, self.steps, self.device, self.drops = generation, steps, device, drops
        # The entries whose indices each call checks after the first ``first`` steps (the
        # entries run at once), before any other.
        self.indexed, self.first = indexed, first
        self.blocks = sum(step[0] == "block" for step in steps)
        # step index -> (operand layouts, tuner key, work) of its compiled kernel, once known
        self.op_keys: dict[int, tuple] = {}
        # attention step index -> (lock, records, bound segment, (ref, input slot)s)
        self.bound: dict[int, tuple] = {}
        # conv step index -> (weak weight, weak bias or None, input layout, tuner generation,
        # launch): the launch of a settled choice on weights nothing can change (_conv)
        self.launches: dict[int, tuple] = {}
        # (tuner, its generation, how each block step runs), where every lookup gave a
        # choice (or nothing to tune); looked up again when the generation changes
        self.hows: tuple = (None, None, {})


def learn(trace: Any, values: list, records: Any, segments: list) -> Program | bool | None:
    """The program of a flush of exactly the records one replay of ``trace`` pushed
    (``records``, a ``ReplayedRecords``; ``values``: their slots by trace reference) run by
    ``segments`` (``(start, length, fused)`` each); False where the trace has a segment no
    step runs, None where this flush cannot show the program (the caller could read other
    values than the call returns: then the blocks keep other outputs)."""
    ref_of = {id(s): r for r, s in enumerate(values) if s is not None}
    readable = {ref_of.get(id(o)) for r in records for o in r.outputs if o.readable()}
    pushed = records.pushed
    entries = trace.entries
    # What the call returns from the records (the rest its entries made at once: a small
    # model's backward pass returns most of its gradients so).
    recorded = trace.returned.intersection(r for i in pushed for r in entries[i].out_refs)
    if readable != recorded or len(records) != len(pushed):
        return None
    executor = trace.backend.executor
    device = entries[0].device
    # The entries that ran at once read made values only (inputs, constants, each other's):
    # they run first.
    ran = set(pushed)
    steps: list[tuple] = [(_now_kind(entries[i]), i) for i in range(len(entries)) if i not in ran]
    if any(not entries[i].now for _, i in steps):
        return False
    run_first = len(steps)
    made: set[int] = {r for _, i in steps for r in entries[i].out_refs}
    readers = readers_of(records)
    added = {i: j for i, (j, _) in accumulations(records, readers, segments).items()}
    adding = {j: i for i, j in added.items()}
    templates = None
    gathered_cats: set[int] = set()  # the cats whose pieces an attention gradient step writes

    def refs(slots) -> tuple | None:
        found = tuple(ref_of.get(id(s)) for s in slots)
        return None if None in found else found

    for start, length, fused in segments:
        if type(fused) is Fused:
            ins, outs = refs(fused.inputs), refs(fused.outputs)
            if (ins is None or outs is None or not fused.outputs
                    or not executor.can_fuse(fused.outputs[0])
                    or any(s.device.place != device.place for s in fused.inputs)):  # fmt: skip
                return False
            steps.append(("block", fused.block, ins, outs))
        elif type(fused) is ConvEpilogue or (fused is None and records[start].name == "conv2d"):
            conv = fused.conv if fused is not None else records[start]
            if (fused is not None and fused.inner_read) or "conv2d" not in executor.op_kernels:
                return False
            ins = refs(conv.inputs)
            out = refs([fused.output if fused is not None else conv.outputs[0]])
            residual = refs([fused.residual]) if fused is not None and fused.residual else ()
            if ins is None or out is None or residual is None:
                return False
            bias = None if conv.args[2] is None else ins[2]
            prefix = ("conv2d+epilogue", bool(residual)) if fused is not None else ()
            first, second = (fused.first, fused.second) if fused else (_NO_BOUNDS, _NO_BOUNDS)
            steps.append(("conv", ins[0], ins[1], bias, conv.args[3], first, second,
                          residual[0] if residual else None, out[0], prefix))  # fmt: skip
            outs = out
        elif fused is None and start in adding:
            continue  # made by its product's step
        elif fused is None and start in added:
            j = added[start]
            outs = refs([*records[start].outputs, *records[j].outputs])
            if outs is None:
                return False
            steps.append(("accumulate", pushed[start], pushed[j]))
        elif fused is None:
            record = records[start]
            outs = refs(record.outputs)
            if outs is None:
                return False
            transposed = record.name == "float_matmul" and read_transposed(record, records, readers)
            if start in gathered_cats:
                kind = "joined"
            elif transposed:
                kind = "transposed"
            elif record.name in VIEW_OPS and not record.multi:
                kind = "view"
            elif record.name in executor.op_kernels:
                kind = "kernel"
            else:
                kind = "op"
            steps.append((kind, pushed[start]))
        elif type(fused) in (Attention, AttentionGrad):
            if templates is None:
                templates = _templates(records)
            template = templates.get(start)
            if template is None:
                return False
            gather = None
            if type(fused) is Attention:
                layout = reader_layout(fused.output, records, readers)
            else:
                layout = [reader_layout(s, records, readers)
                          for s in (fused.d_query, fused.d_key, fused.d_value)]  # fmt: skip
                gather = joins.gathered(fused, records, readers)
                if gather is not None and "float_cat" in executor.op_kernels:
                    gathered_cats.add(gather[0])
                    gather = (pushed[gather[0]], gather[1])
                else:
                    gather = None
            outs = refs([o for r in records[start : start + length] for o in r.outputs])
            if outs is None:
                return False
            steps.append(("attention", template, pushed[start : start + length], layout, gather))
        elif type(fused) is MatmulEpilogue and "float_matmul" in executor.op_kernels:
            outs = refs([o for r in records[start : start + length] for o in r.outputs])
            if outs is None:
                return False
            steps.append(("product", pushed[start], pushed[start + 1], fused.keep_value))
        else:
            return False  # a product's epilogue (Triton): the records run
        made.update(outs)
    if not trace.returned <= made:
        return False
    # An indexed op's indices are checked before any launch (a random op's draw cannot be
    # taken back): they are to be the call's inputs, constants, or results of the entries
    # run at once, which run first and draw nothing.
    indexed = tuple(i for i in sorted(ran) if entries[i].indexed)
    known = {r for r, _ in trace.consts} | {
        r for _, i in steps[:run_first] for r in entries[i].out_refs}  # fmt: skip
    if any(entries[i].refs[1] >= trace.n_inputs and entries[i].refs[1] not in known
           for i in indexed):  # fmt: skip
        return False
    return Program(Explorer.generation(), tuple(steps), device, _drops(trace, steps), indexed,
                   run_first)  # fmt: skip


def _indices_fit(program: Program, entries: list, slots: list, prims: list, specs: dict) -> bool:
    """Whether every indexed entry's indices lie within its dim (``handle.indices_fit``)."""
    for k in program.indexed:
        data, indices = entries[k].refs[:2]
        data_slot = Slot(*specs[data]) if slots[data] is None else slots[data]
        index_slot = Slot(*specs[indices], prim=prims[indices]) if slots[indices] is None \
            else slots[indices]  # fmt: skip
        if not indices_fit([data_slot, index_slot], entries[k].attrs):
            return False
    return True


def _templates(records: Any) -> dict:
    """The templates of the plan the executor bound ``records`` by, by segment start."""
    readable = tuple([o.readable() for r in records for o in r.outputs])
    found = records.plans.get((records.pushed, readable))
    if found is None or found[1] is None:
        return {}
    return {start: template for start, _, template in found[1] if template is not None}


def _reads(trace: Any, step: tuple) -> set[int]:
    """The trace references ``step`` reads."""
    kind = step[0]
    if kind == "block":
        return set(step[2])
    if kind == "conv":
        return {r for r in (step[1], step[2], step[3], step[7]) if r is not None}
    if kind == "attention":
        return {r for i in step[2] for r in trace.entries[i].refs if r >= 0}
    if kind in ("accumulate", "product"):
        return {r for i in step[1:3] for r in trace.entries[i].refs if r >= 0}
    return {r for r in trace.entries[step[1]].refs if r >= 0}


def _now_kind(entry: Any) -> str:
    """The step of an entry that ran at once: a layout op runs as a view where it gives one
    (``view``), any other as its op (``op``)."""
    return "view" if entry.name in VIEW_OPS and not entry.multi else "op"


def _drops(trace: Any, steps: list[tuple]) -> tuple[tuple[int, ...], ...]:
    """For each step, the values made in the call that no later step reads and the call
    does not return: dropped after it, so that their buffers go back to the pool for the
    steps after it."""
    last: dict[int, int] = {}
    for k, step in enumerate(steps):
        for r in _reads(trace, step):
            last[r] = k
    made_here = {r for entry in trace.entries for r in entry.out_refs}
    drops: list[list[int]] = [[] for _ in steps]
    for r, k in last.items():
        if r in made_here and r not in trace.returned:
            drops[k].append(r)
    return tuple(tuple(d) for d in drops)


def run(trace: Any, program: Program, tensors: list) -> Any:
    """``trace``'s outputs for the call's ``tensors``, computed now by ``program``; None
    where the records must run instead (see the module doc)."""
    if program.generation != Explorer.generation():
        trace.program = None  # made again from the next flush
        return None
    executor = trace.backend.executor
    route = executor._route(program.device.place)
    hows = _hows(program, route[2])
    if hows is None:
        return None  # the records run: the tuner times a block there
    recycler = route[3]
    slots: list[Any] = [None] * trace.n_refs  # made slots, where one exists
    prims: list[Any] = [None] * trace.n_refs  # inner values
    pooled: list[bool] = [False] * trace.n_refs  # a value the runtime's pool handed out
    for n, slot in enumerate(trace.input_slots(tensors)):
        if slot.prim is None:
            return None  # pending: its stream runs first, with the records
        slots[n], prims[n] = slot, slot.prim
    for r, slot in trace.consts:
        slots[r], prims[r] = slot, slot.prim
    specs = trace.specs
    entries = trace.entries
    made = _Made(trace, program, executor, route, slots, prims, pooled, hows)
    try:
        for i, step in enumerate(program.steps):
            if i == program.first and not _indices_fit(program, entries, slots, prims, specs):
                return None  # the records run: the op raises as a plain call's does
            if not made.run(i, step):
                return None
            # Read by no later step: back to the pool (the step's own references died with
            # its call).
            for r in program.drops[i]:
                slots[r] = prims[r] = None
    except UnsupportedError:
        trace.program = False  # the runtime refuses a launch: the records run, from now on
        return None
    replays, direct_replays = trace.counted
    counters.add_each(**{replays: 1, direct_replays: 1}, kernels=program.blocks,
                      fused_ops=len(trace.entries), unfused_ops=made.unfused)  # fmt: skip
    for r in trace.returned:
        slot = slots[r]
        if slot is None:
            shape, dtype, device = specs[r]
            slot = slots[r] = Slot(shape, dtype, device, prim=prims[r])
            if pooled[r] and recycler is not None:
                slot.recycle = recycler
    return trace.output_values(slots, tensors)


def _hows(program: Program, tuner: Any) -> dict | None:
    """How each block step of ``program`` runs (the tuner's choice, or None where it does
    not tune the block), kept on the program while the tuner's generation holds; None
    where a block is still to be tuned or runs unfused (then the records run)."""
    if tuner is None:
        return {}
    kept_tuner, generation, hows = program.hows
    now = tuner.generation()
    if kept_tuner is tuner and generation == now:
        return hows
    hows = {}
    for i, step in enumerate(program.steps):
        if step[0] == "block":
            how = tuner.lookup(step[1])
            if how is not None and not _fused(how):
                return None
            hows[i] = how
    program.hows = (tuner, now, hows)
    return hows


class _Made:
    """One call's values, by trace reference, and how each step makes its own."""

    __slots__ = ("executor", "from_array", "hows", "pooled", "prims", "program", "runtime",
                 "slots", "to_array", "trace", "unfused")  # fmt: skip

    def __init__(self, trace: Any, program: Program, executor: Any, route: tuple, slots: list,
                 prims: list, pooled: list, hows: dict) -> None:  # fmt: skip
        self.trace, self.program, self.executor = trace, program, executor
        self.slots, self.prims, self.pooled, self.hows = slots, prims, pooled, hows
        self.runtime, (self.to_array, self.from_array), _, _ = route
        self.unfused = 0  # ops run on the inner backend by :meth:`_inner`, counted once a call

    def run(self, i: int, step: tuple) -> bool:
        """Runs step ``i``; False where the records must run instead (the program is
        dropped for good where it cannot run again)."""
        kind, trace, prims, specs = step[0], self.trace, self.prims, self.trace.specs
        entries, executor, slots = trace.entries, self.executor, self.slots
        if kind == "block":
            _, block, ins, outs = step
            arrays = []
            for r, spec in zip(ins, block.inputs):
                array = self.to_array(prims[r])
                arrays.append(array if array.shape == spec.shape else array.reshape(spec.shape))
            how = self.hows.get(i)  # none without a tuner
            if how is None:
                results = self.runtime.run(block, arrays)
            else:
                results = self.runtime.run(block, arrays, None, how.setting)
            for r, array in zip(outs, results, strict=True):
                shape = specs[r][0]
                if array.shape != shape:
                    array = array.reshape(shape)
                prims[r] = prim = self.from_array(array)
                self.pooled[r] = prim is array
        elif kind == "conv":
            out = _conv(executor, self.program, i, step, prims, self.to_array)
            if out is None:
                trace.program = False  # not the kernel's: the records run, from now on
                return False
            prims[step[8]] = prim = self.from_array(out)
            self.pooled[step[8]] = prim is out
        elif kind == "attention":
            if not self._attention(i, step):
                trace.program = False  # the template no longer binds
                return False
        elif kind == "accumulate":  # a product added into its addend, or the two records
            indices = step[1:]
            made = [_record(entries[k], slots, prims, specs) for k in indices]
            product, addition = made
            term = addend(addition, product.outputs[0])
            other = entries[indices[1]].refs[addition.inputs.index(term)]
            # A block's output is pooled by its flag, an op's by its slot; the slot holds it
            # alone now.
            pooled, prims[other] = (True if self.pooled[other] else None), None
            accumulated = executor.run_accumulated(product, addition, pooled)
            prims[other] = slots[other].prim
            if accumulated:
                self.pooled[entries[indices[1]].out_refs[0]] = True
            else:
                for record in made:
                    executor.run_single(record)
            _keep(entries, indices, made, slots, prims)
        elif kind == "product":
            indices = step[1:3]
            product, addition = entries[indices[0]], entries[indices[1]]
            ran = None if step[3] else self._kernel(i, product, addition)
            if ran:
                return True
            # Not the GEMM with its bias: the two ops one by one, as Executor.run_biased
            # runs them (the tuner times a pending choice on the records).
            if ran is None and self._alone(-1 - i, indices[0]):
                self._alone(None, indices[1])
                return True
            made = [_record(entries[k], slots, prims, specs) for k in indices]
            executor.run_biased(*made, step[3])
            _keep(entries, indices, made, slots, prims)
        elif kind == "joined":
            entry = entries[step[1]]
            joined = joins.joined_view([prims[r] for r in entry.refs], entry.attrs[0],
                             specs[entry.out_refs[0]][0])  # fmt: skip
            if joined is None:
                return self._alone(i, step[1])  # the pieces lie apart: a plain cat
            else:
                prims[entry.out_refs[0]] = joined
                counters.add("joined_in_place")
        else:
            entry = entries[step[1]]
            if kind == "view" and _view(executor.inner, entry, prims):
                return True
            if kind == "transposed":
                record = _record(entry, slots, prims, specs)
                if not executor.run_transposed(record):
                    executor.run_single(record)
                _keep(entries, (step[1],), (record,), slots, prims)
            else:
                # False where the tuner's choice is pending (re-timed, say): the records run
                return self._alone(i if kind == "kernel" else None, step[1])
        return True

    def _attention(self, i: int, step: tuple) -> bool:
        """Runs an ``attention`` step's segment by the executor's own method, on records
        bound to its template once per program: they keep slots of their own, which each
        call fills with its values and empties after (binding matches the segment's
        records again: about 300 us of Python a step, cold, and making the records 100
        more). A thread that finds them in use binds records of its own. False where the
        template no longer binds."""
        _, template, indices, layout, gather = step
        trace, prims = self.trace, self.prims
        entries = trace.entries
        take = None if gather is None else self._gather(gather)
        bound = self.program.bound.get(i)
        if bound is None:
            own: list = [None] * trace.n_refs
            for r, slot in trace.consts:  # a constant's own slot, never emptied
                own[r] = slot
            made, fused = self._bind(template, indices, own)
            if fused is None:
                return False
            fixed = {r for k in indices for r in entries[k].out_refs}
            fixed.update(r for r, _ in trace.consts)
            inputs = {r: own[r] for k in indices for r in entries[k].refs
                      if r >= 0 and r not in fixed}  # fmt: skip
            bound = self.program.bound[i] = (threading.Lock(), made, fused, tuple(inputs.items()))
        lock, made, fused, inputs = bound
        if not lock.acquire(blocking=False):
            made, fused = self._bind(template, indices, self.slots)
            if fused is None:
                return False
            self._attend(fused, made, layout, take)
            _keep(entries, indices, made, self.slots, prims)
            return True
        try:
            for r, slot in inputs:
                slot.prim = prims[r]
            self._attend(fused, made, layout, take)
            for k, record in zip(indices, made, strict=True):
                for r, slot in zip(entries[k].out_refs, record.outputs, strict=True):
                    prims[r] = slot.prim
                    self.pooled[r] = slot.recycle is not None  # the executor's pooled outputs
        finally:  # the bound slots hold no value between calls
            for record in made:
                for slot in record.outputs:
                    slot.prim = None
            for _, slot in inputs:
                slot.prim = None
            lock.release()
        return True

    def _bind(self, template: Any, indices: tuple, slots: list) -> tuple[list, Any]:
        """Records of trace entries ``indices`` on ``slots`` (made where absent), and the
        segment ``template`` binds them to (None where it no longer binds)."""
        made = [_record(self.trace.entries[k], slots, self.prims, self.trace.specs)
                for k in indices]  # fmt: skip
        return made, template.bind(made)

    def _attend(self, fused: Any, made: list, layout: Any, take: Any = None) -> None:
        if type(fused) is Attention:
            self.executor._attention(fused, made, layout)
        else:
            self.executor._attention_grad(fused, made, layout, take)

    def _gather(self, gather: tuple) -> Any:
        """An allocator for an attention gradient step's three results: views of one
        pooled array laid out as the cat that joins them (``joins.gathered``: ``(the cat's
        entry, ((piece, chain) per result))``), so that the kernel writes the join in place
        and the cat's ``joined`` step copies nothing; None where a view cannot be made (a
        reshape that would copy)."""
        k, results = gather
        entry = self.trace.entries[k]
        specs = self.trace.specs
        shape = specs[entry.out_refs[0]][0]
        dim = entry.attrs[0] % len(shape)
        joined = self.runtime.pool.take(shape, np.float32)
        views = joins.piece_views(joined, dim, [specs[r][0][dim] for r in entry.refs], results)
        return None if views is None else joins.taker(views)

    def _alone(self, i: int | None, k: int) -> bool:
        """Runs trace entry ``k`` as ``Executor.run_single`` would: with its compiled kernel
        at the tuner's settled choice for step ``i`` (None: an op without one), else as the
        inner op on the arrays themselves (:meth:`_inner`), else as its record. False,
        running nothing, where the tuner's choice is pending: the records time it."""
        entries = self.trace.entries
        ran = None if i is None else self._kernel(i, entries[k])
        if ran is False:
            return False
        if not ran and not self._inner(entries[k]):
            record = _record(entries[k], self.slots, self.prims, self.trace.specs)
            self.executor.run_single(record)
            _keep(entries, (k,), (record,), self.slots, self.prims)
        return True

    def _inner(self, entry: Any) -> bool:
        """Runs ``entry``'s op on the inner backend, on the arrays themselves, where
        ``Executor.run_single`` would run that op too (no pooled reshape, no element-wise
        kernel of its own; an op with a compiled kernel only once its step declined it):
        its record and slots cost about 30 us of Python more (a bias gradient's sum, a
        global pooling's mean, a small product). False where the record is to run."""
        executor, prims = self.executor, self.prims
        operands = []
        for r in entry.refs:
            if r < 0:
                operands.append(None)
                continue
            array = prims[r]
            if type(array) is not np.ndarray:
                return False
            operands.append(array)
        if not runs_inner(entry, entry.outputs[0][0]):
            return False
        args = entry.call_args(operands)
        inner = executor.inner
        op = getattr(inner, entry.name)
        kernel = executor.op_kernels.get(entry.name)
        out = op(*args) if kernel is None else executor.run_inner(kernel, lambda: op(*args), args)
        if entry.multi:
            for r, array, (shape, dtype, _) in zip(entry.out_refs, out, entry.outputs, strict=True):
                check_output(inner, array, shape, dtype, entry.name)
                prims[r] = array
        else:
            shape, dtype, _ = entry.outputs[0]
            check_output(inner, out, shape, dtype, entry.name)
            prims[entry.out_refs[0]] = out
        self.unfused += 1
        return True

    def _kernel(self, i: int, entry: Any, addition: Any = None) -> bool | None:
        """Runs a ``kernel`` step's op, or a ``product`` step's product and the addition of
        its bias (``addition``: the GEMM with the bias), with its compiled kernel at the
        tuner's settled choice, on the arrays themselves: the records, their slots and the
        executor's single-op path cost about 30 us of Python more a product in a training
        step (cold). False where the records are to run (the choice is pending: they time
        it); None where the kernel is not to run (a case it does not take, a bias of
        another kind, too small to time, or the inner op chosen)."""
        prims = self.prims
        args = entry.call_args([None if r < 0 else prims[r] for r in entry.refs])
        kernel = self.executor.op_kernels[entry.name]
        bias = None
        if addition is not None:
            bias = prims[addition.refs[1 - addition.refs.index(entry.out_refs[0])]]
            if type(bias) is not np.ndarray:
                return None
        how = _settled(self.executor, self.program, i, kernel, args,
                       () if bias is None else ("matmul+bias",))  # fmt: skip
        if not _fused(how):
            return False if type(how) is autotune.Pending else None
        take = self.runtime.pool.take
        if bias is None:
            out = kernel.run(args, how.threads, take)
        else:
            out = matmul_with_bias(args, bias, how.threads, take)
        outs = out if addition is None and entry.multi else (out,)
        for r, array in zip((addition or entry).out_refs, outs, strict=True):
            prims[r] = prim = self.from_array(array)
            self.pooled[r] = prim is array
        counters.add_each(op_kernels=1, fused_ops=0 if addition is None else 2)
        return True


def _settled(executor: Any, program: Program, i: int, kernel: Any, args: list,
             prefix: tuple = ()) -> Any:  # fmt: skip
    """The tuner's answer for ``kernel`` (an ``op_kernels`` entry) on step ``i``'s ``args``
    (its key after ``prefix``): a choice, pending, or None where the kernel does not take
    them or the work is too small to time. The key and work are kept per step (``i``: any
    int the caller keeps apart) with the arrays' layouts they were worked out for."""
    arrays = args[0] if type(args[0]) is list else args  # a spread op's operands (a cat's)
    layouts = tuple([(a.shape, a.strides) for a in arrays if type(a) is np.ndarray])
    known = program.op_keys.get(i)
    if known is None or known[0] != layouts:
        if not kernel.supports(args):
            return None
        known = program.op_keys[i] = (layouts, (*prefix, *kernel.key(args)), kernel.work(args))
    return executor.tuner.lookup_op(known[1], known[2])


def _fused(how: Any) -> bool:
    """Whether the tuner's answer ``how`` is a settled choice of the compiled kernel."""
    return type(how) is autotune.Choice and how != autotune.UNFUSED


def _view(inner: Any, entry: Any, prims: list) -> bool:
    """Runs a ``view`` step's layout op on its operand's array where it gives a view (a
    permute, an expand, a slice, a reshape of a C-contiguous array): a record, its slots and
    the executor's checks cost about 40 us a step in a training step, where NumPy's view
    costs one. False where the record is to run (a reshape that copies goes to the pool
    there)."""
    x = prims[entry.refs[0]]
    if type(x) is not np.ndarray or (entry.name == "float_reshape" and not x.flags.c_contiguous):
        return False
    prims[entry.out_refs[0]] = getattr(inner, entry.name)(x, *entry.attrs)
    counters.add("unfused_ops")
    return True


def _conv(executor: Any, program: Program, i: int, step: tuple, prims: list, to_array) -> Any:
    """A ``conv`` step's output array, or None where the tuner did not choose the kernel
    for it (too small to time, or NdArray's convolution).

    The launch of a settled choice on weights nothing can change is kept per step, while
    the same weight arrays come with inputs of the same layout and the tuner's generation
    holds: the tuner's lookup and ``numba_conv.launch_for`` cost about 15 us of Python a
    convolution on a cold cache (the ONNX CNN's ten: 0.15 ms of a 5.5 ms forward)."""
    from ember.backends.fusion import numba_conv

    _, x, weight, bias, options, first, second, residual, _, prefix = step
    x, weight = to_array(prims[x]), to_array(prims[weight])
    bias = None if bias is None else to_array(prims[bias])
    layout = (x.shape, x.strides, x.dtype)
    tuner = executor.tuner
    fixed = immutable(weight) and (bias is None or immutable(bias))
    kept = program.launches.get(i)
    if (fixed and kept is not None and kept[0]() is weight
            and (bias is None or kept[1]() is bias) and kept[2] == layout
            and kept[3] == tuner.generation()):  # fmt: skip
        launch = kept[4]
    else:
        args = [x, weight, bias, options]
        how = _settled(executor, program, i, executor.op_kernels["conv2d"], args, prefix)
        if not _fused(how):
            return None
        launch = numba_conv.launch_for(*args, how.threads, (first, second) if prefix else None)
        if fixed:
            program.launches[i] = (weakref.ref(weight), None if bias is None else
                                   weakref.ref(bias), layout, tuner.generation(), launch)  # fmt: skip
    counters.add("op_kernels")
    return numba_conv.run(launch, x, executor.runtime.pool.take,
                          None if residual is None else to_array(prims[residual]))  # fmt: skip


def _record(entry: Any, slots: list, prims: list, specs: dict) -> Record:
    """A record of trace entry ``entry`` on made slots (made for values that have none
    yet), its outputs new slots, registered in ``slots``."""
    for r in entry.refs:
        if r >= 0 and slots[r] is None:
            shape, dtype, device = specs[r]
            slots[r] = Slot(shape, dtype, device, prim=prims[r])
    operands = [None if r < 0 else slots[r] for r in entry.refs]
    record = entry.record(operands, tuple([s for s in operands if s is not None]))
    for r, slot in zip(entry.out_refs, record.outputs, strict=True):
        slots[r] = slot
    return record


def _keep(entries: list, indices, records, slots: list, prims: list) -> None:
    """Takes the values the records of ``entries[indices]`` made into ``prims``."""
    for k, record in zip(indices, records, strict=True):
        for r, slot in zip(entries[k].out_refs, record.outputs, strict=True):
            slots[r], prims[r] = slot, slot.prim
