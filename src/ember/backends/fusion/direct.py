"""A replay without records: the launches of a trace's flush, kept and run on the arrays.

A replayed call (``replayed.py``) pushes its trace's records into the stream, and the
stream's flush plans, binds and launches them: Python that a small model pays on every
call, and pays cold, since each kernel before it streamed its data through the caches (a
replayed layer norm's call at two threads spent 240 us of Python around a 0.8 ms kernel).
Where the first replay's flush held exactly the trace's records and ran every segment as
one of the launches below, :func:`learn` keeps those launches as a :class:`Program`, with
each value named by its trace reference; later calls :func:`run` it on the input arrays
at once:

* ``block``: an element-wise block (``Fused``), launched on the runtime as the executor's
  ``_launch`` does, with the tuner's settled choice;
* ``conv``: a convolution with its epilogue (``ConvEpilogue``) or alone, launched on the
  numba kernel at the tuner's settled thread count, as ``_conv_epilogue`` and
  ``_run_op_kernel`` do;
* ``op``: any other single record, run by ``Executor.run_single`` on made slots (a
  reshape, the mean of a global pooling, a product).

The outputs are made when the call returns, so ops after the call no longer fuse with its
last block. :func:`run` hands the call back to the records (returns None) where they
must run: an input still pending, a block the tuner has not settled or runs unfused,
plans forgotten since the program was made (``Explorer.generation``); where a launch is
refused or was never the kernel's (too small to time), the program is dropped for good.
"""

from __future__ import annotations

from typing import Any

from ember.backend.device import Device
from ember.backend.errors import UnsupportedError
from ember.backends.fusion import autotune, counters
from ember.backends.fusion.conv_epilogue import ConvEpilogue
from ember.backends.fusion.explorer import Explorer
from ember.backends.fusion.fuser import Fused
from ember.backends.fusion.handle import Slot
from ember.backends.fusion.stream import Record

_NO_BOUNDS = (None, None)


class Program:
    """A trace's flush as launches (see the module doc): ``steps`` in order, each a tuple
    whose first item names its kind; ``generation`` the explorer's when it was made."""

    __slots__ = ("blocks", "conv_keys", "device", "generation", "steps")

    def __init__(self, generation: int, steps: tuple, device: Device) -> None:
        self.generation, self.steps, self.device = generation, steps, device
        self.blocks = sum(step[0] == "block" for step in steps)
        self.conv_keys: dict[int, tuple] = {}  # step index -> (tuner key, work), once known


def learn(trace: Any, values: list, records: list[Record], segments: list) -> Program | bool | None:
    """The program of a flush of exactly ``trace``'s records (``values``: their slots by
    trace reference) run by ``segments`` (``(start, length, fused)`` each); False where
    the trace has a segment no step runs, None where this flush cannot show the program
    (the caller could read other values than the call returns: then the blocks keep other
    outputs)."""
    ref_of = {id(s): r for r, s in enumerate(values) if s is not None}
    readable = {ref_of.get(id(o)) for r in records for o in r.outputs if o.readable()}
    if readable != trace.returned or len(records) != len(trace.entries):
        return None
    executor = trace.backend.executor
    device = trace.entries[0].device
    steps: list[tuple] = []
    made: set[int] = set()

    def refs(slots) -> tuple | None:
        found = tuple(ref_of.get(id(s)) for s in slots)
        return None if None in found else found

    for start, _, fused in segments:
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
        elif fused is None:
            record = records[start]
            if record.name == "float_matmul" and _read_transposed(record, records):
                return False  # the executor computes it transposed for that reader
            outs = refs(record.outputs)
            if outs is None:
                return False
            steps.append(("op", start))
        else:
            return False  # an attention or a product's epilogue: the records run
        made.update(outs)
    if not trace.returned <= made:
        return False
    return Program(Explorer.generation(), tuple(steps), device)


def _read_transposed(record: Record, records: list[Record]) -> bool:
    out = record.outputs[0]
    return any(r.name == "float_permute" and out in r.inputs for r in records)


def run(trace: Any, program: Program, tensors: list) -> Any:
    """``trace``'s outputs for the call's ``tensors``, computed now by ``program``; None
    where the records must run instead (see the module doc)."""
    if program.generation != Explorer.generation():
        trace.program = None  # made again from the next flush
        return None
    executor = trace.backend.executor
    runtime, (to_array, from_array), tuner, recycler = executor._route(program.device.place)
    hows = {}
    for i, step in enumerate(program.steps):
        if step[0] == "block":
            how = None if tuner is None else tuner.lookup(step[1])
            if how is not None and (type(how) is not autotune.Choice or how == autotune.UNFUSED):
                return None  # the records run: the tuner times the block there
            hows[i] = how
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
    try:
        for i, step in enumerate(program.steps):
            kind = step[0]
            if kind == "block":
                _, block, ins, outs = step
                arrays = [to_array(prims[r]).reshape(s.shape) for r, s in zip(ins, block.inputs)]
                how = hows[i]
                if how is None:
                    results = runtime.run(block, arrays)
                else:
                    results = runtime.run(block, arrays, None, how.setting)
                for r, array in zip(outs, results, strict=True):
                    shape = specs[r][0]
                    if array.shape != shape:
                        array = array.reshape(shape)
                    prims[r] = prim = from_array(array)
                    pooled[r] = prim is array
            elif kind == "conv":
                out = _conv(executor, program, i, step, prims, to_array)
                if out is None:
                    trace.program = False  # not the kernel's: the records run, from now on
                    return None
                prims[step[8]] = prim = from_array(out)
                pooled[step[8]] = prim is out
            else:
                _op(executor, trace.entries[step[1]], slots, prims, specs)
    except UnsupportedError:
        trace.program = False  # the runtime refuses a launch: the records run, from now on
        return None
    counters.add_each(direct_replays=1, kernels=program.blocks, fused_ops=len(trace.entries))
    for r in trace.returned:
        slot = slots[r]
        if slot is None:
            shape, dtype, device = specs[r]
            slot = slots[r] = Slot(shape, dtype, device, prim=prims[r])
            if pooled[r] and recycler is not None:
                slot.recycle = recycler
    # Intermediates go back to the pool as their arrays die (its loans' weak references).
    return trace.output_values(slots, tensors)


def _conv(executor: Any, program: Program, i: int, step: tuple, prims: list, to_array) -> Any:
    """A ``conv`` step's output array, or None where the tuner did not choose the kernel
    for it (too small to time, or NdArray's convolution)."""
    from ember.backends.fusion import numba_conv

    _, x, weight, bias, options, first, second, residual, _, prefix = step
    args = [to_array(prims[x]), to_array(prims[weight]),
            None if bias is None else to_array(prims[bias]), options]  # fmt: skip
    kernel = executor.op_kernels["conv2d"]
    known = program.conv_keys.get(i)
    if known is None:
        if not kernel.supports(args):
            return None
        known = program.conv_keys[i] = ((*prefix, *kernel.key(args)), kernel.work(args))
    how = executor.tuner.lookup_op(*known)
    if type(how) is not autotune.Choice or how == autotune.UNFUSED:
        return None
    launch = numba_conv.launch_for(*args, how.threads, (first, second) if prefix else None)
    counters.add_each(op_kernels=1)
    return numba_conv.run(launch, args[0], executor.runtime.pool.take,
                          None if residual is None else to_array(prims[residual]))  # fmt: skip


def _op(executor: Any, entry: Any, slots: list, prims: list, specs: dict) -> None:
    """Runs a trace entry as a record on made slots (``Executor.run_single``)."""
    present = []
    for r in entry.refs:
        if r >= 0 and slots[r] is None:
            shape, dtype, device = specs[r]
            slots[r] = Slot(shape, dtype, device, prim=prims[r])
        if r >= 0:
            present.append(slots[r])
    operands = [None if r < 0 else slots[r] for r in entry.refs]
    call_args = [operands, *entry.attrs] if entry.spread else [*operands, *entry.attrs]
    outputs = tuple([Slot(shape, dtype, device) for shape, dtype, device in entry.outputs])
    executor.run_single(Record(entry.op, entry.name, call_args, tuple(present), outputs,
                               entry.multi))  # fmt: skip
    for r, slot in zip(entry.out_refs, outputs, strict=True):
        slots[r], prims[r] = slot, slot.prim
