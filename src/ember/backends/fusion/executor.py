"""Running records on the inner backend, one primitive call each (the unfused path).

This is what runs every record no fuser takes, and the whole stream when fusion is off.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ember.backend.base import Backend
from ember.backend.environment import switch
from ember.backend.errors import (
    ArgumentError,
    BackendUnavailableError,
    EmberError,
    UnsupportedError,
    fmt_shape,
)
from ember.backends.fusion import autotune, counters, joins
from ember.backends.fusion.attention import (
    Attention,
    AttentionFuser,
    AttentionTemplate,
    attention_arrays,
    run_attention,
)
from ember.backends.fusion.attention_grad import (
    AttentionGrad,
    AttentionGradFuser,
    grad_arrays,
    run_attention_grad,
)
from ember.backends.fusion.buffers import empty_in_order
from ember.backends.fusion.conv_epilogue import ConvEpilogue, EpilogueTemplate, run_conv_epilogue
from ember.backends.fusion.elementwise import ElementwiseFuser, elementwise
from ember.backends.fusion.explorer import Explorer
from ember.backends.fusion.handle import Slot
from ember.backends.fusion.matmul_epilogue import (
    BiasedMatmulFuser,
    MatmulEpilogue,
    MatmulEpilogueFuser,
    MatmulTemplate,
)
from ember.backends.fusion.stream import Record, ReplayedRecords
from ember.backends.fusion.views import VIEW_OPS, last_two_swapped
from ember.backends.ndarray.parallel import blas_held_to_one
from ember.tensor.data import numpy_dtype
from ember.tensor.dtype import DType


def inner_args(record: Record) -> list:
    """The record's arguments with each slot replaced by its (made) inner primitive."""
    args = list(record.args)
    for i, arg in enumerate(args):
        if type(arg) is Slot:
            args[i] = _made(arg, record)
        elif type(arg) is list and arg and type(arg[0]) is Slot:
            args[i] = [_made(s, record) for s in arg]
    return args


def _made(slot: Slot, record: Record):
    if slot.prim is None:
        raise EmberError(f"fusion: {record.name} reads %{slot.id}, which an earlier failed op "
                         "was to make")  # fmt: skip
    return slot.prim


def run_record(inner: Backend, record: Record) -> None:
    """Runs one record on ``inner`` and stores its outputs in their slots."""
    out = getattr(inner, record.name)(*inner_args(record))
    outs = out if record.multi else (out,)
    for slot, prim in zip(record.outputs, outs, strict=True):
        set_output(inner, slot, prim, record.name)


def run_detached(inner: Backend, records: list[Record]) -> None:
    """Computes ``records`` on ``inner`` as :func:`run_record` does, storing nothing: their
    outputs live in a local table and are dropped (how a tuning times the unfused ops)."""
    made: dict[int, object] = {}

    def value(arg):
        if type(arg) is Slot:
            return made[arg.id] if arg.id in made else _made(arg, records[0])
        if type(arg) is list and arg and type(arg[0]) is Slot:
            return [value(s) for s in arg]
        return arg

    for record in records:
        out = getattr(inner, record.name)(*[value(a) for a in record.args])
        for slot, prim in zip(record.outputs, out if record.multi else (out,), strict=True):
            made[slot.id] = prim


def set_output(inner: Backend, slot: Slot, prim, what: str) -> None:
    """Stores ``prim`` in ``slot``, checked by :func:`check_output`."""
    check_output(inner, prim, slot.shape, slot.dtype, what)
    slot.prim = prim


def check_output(inner: Backend, prim, shape: tuple, dtype: DType, what: str) -> None:
    """Checks that ``prim`` is the ``shape`` and ``dtype`` the op's rule promised: the user
    already holds the promised ones, so a mismatch is a bug worth a loud error."""
    made, made_dtype = inner.shape(prim), inner.dtype(prim)
    if made != shape or made_dtype is not dtype:
        raise EmberError(f"fusion: {what} made {fmt_shape(made)} {made_dtype}, its rule said "
                         f"{fmt_shape(shape)} {dtype}")  # fmt: skip


RUNTIMES = ("numba", "interpreter", "triton")
_shared: dict[str, object] = {}


def runtime_named(name: str | None = None):
    """The runtime fused blocks run on, shared by every fusion device of the process (so
    kernels compile once): ``"numba"`` (compiled kernels, the default) or
    ``"interpreter"`` (NdArray's kernels one instruction at a time: for tests and for
    machines without numba), or ``"triton"`` (GPU kernels on torch CUDA tensors; on CPU
    tensors under ``TRITON_INTERPRET=1``). ``None`` reads ``EMBER_FUSION_RUNTIME``, else
    ``"numba"``.

    Raises:
        BackendUnavailableError: numba is wanted and not installed (``pip install 'ember[jit]'``),
            or triton is wanted and not installed (``ember[gpu-jit]``) or has no GPU to run on.
        ArgumentError: an unknown name.
    """
    name = name or os.environ.get("EMBER_FUSION_RUNTIME") or "numba"
    if name not in RUNTIMES:
        raise ArgumentError(f"fusion: unknown runtime {name!r}; expected one of {RUNTIMES} "
                            "(argument runtime= or EMBER_FUSION_RUNTIME)")  # fmt: skip
    key = name
    if name == "triton":  # one runtime for CUDA, another for Triton's interpreter (CPU)
        from ember.backends.fusion import triton_runtime

        key = f"triton:{'interpreter' if triton_runtime.interpreting() else 'cuda'}"
    found = _shared.get(key)
    if found is None:
        if name == "numba":
            from ember.backends.fusion import numba_runtime

            if not numba_runtime.available():
                raise BackendUnavailableError(
                    "fusion: compiled kernels need numba; install the extra with "
                    "pip install 'ember[jit]', or pass runtime='interpreter'")  # fmt: skip
            found = numba_runtime.NumbaRuntime()
        elif name == "triton":
            found = triton_runtime.TritonRuntime()  # raises, saying why, where it cannot run
        else:
            from ember.backends.fusion.interpreter import InterpreterRuntime

            found = InterpreterRuntime()
        _shared[key] = found
    return found


def takes_torch(runtime) -> bool:
    """Whether ``runtime`` computes on torch tensors as they are (the Triton runtime) rather
    than on NumPy arrays."""
    return getattr(runtime, "tensors", "numpy") == "torch"


class Executor:
    """Runs a stream: its fused blocks on ``runtime``, the other records on ``inner``.

    Blocks run only where the inner backend's values can reach a runtime without a copy:
    CPU values as NumPy arrays (NdArray; Torch on the CPU) for the numba and interpreter
    runtimes, torch tensors as they are for the Triton runtime (CUDA tensors; CPU ones
    under Triton's interpreter); elsewhere every record runs unfused. ``gpu_runtime`` is
    the runtime of CUDA values beside a CPU ``runtime`` (:meth:`use_gpu`).
    """

    def __init__(self, inner: Backend, runtime=None, gpu_runtime=None) -> None:
        self.inner = inner
        self.runtime = runtime if runtime is not None else runtime_named()
        fusers = [ElementwiseFuser(self.can_fuse),
                  ElementwiseFuser(self.can_fuse, reduce=True, totals=not takes_torch(self.runtime))]
        if takes_torch(self.runtime):
            on_cpu = inner.name == "torch" and self.runtime.place == "cpu"
            self.arrays = (_same, _same) if on_cpu else None
            if self.runtime.place == "cuda" and gpu_runtime is None:
                gpu_runtime = self.runtime
        else:
            self.arrays = numpy_bridge(inner)
        self.gpu_runtime = None
        self.gpu_tuner = None
        # How each large block runs (fused at a thread count, or unfused), timed on first use.
        self.tuner = autotune.tuner_for(self.runtime) if self.arrays is not None else None
        # Compiled candidates for single ops (convolution, pooling), chosen by the tuner.
        self.op_kernels = {}
        if self.tuner is not None and inner.name == "ndarray":
            from ember.backends.fusion.conv_epilogue import ConvEpilogueFuser
            from ember.backends.fusion.op_kernels import NDARRAY_KERNELS

            self.op_kernels = NDARRAY_KERNELS
            # A convolution's activation and residual add, inside its kernel's store; a
            # linear layer's bias, where the GEMM's sums start.
            fusers += [ConvEpilogueFuser(self.can_fuse), BiasedMatmulFuser(self.can_fuse)]
        if self.tuner is not None and not takes_torch(self.runtime):
            # Scaled dot-product attention and its gradient, the scores never written.
            fusers += [AttentionFuser(self.can_fuse), AttentionGradFuser(self.can_fuse)]
        if takes_torch(self.runtime) or gpu_runtime is not None:
            # A matmul's bias, activation and residual add, inside a Triton matmul's store.
            fusers.append(MatmulEpilogueFuser(self.can_fuse_triton))
        self.explorer = Explorer(fusers)
        if gpu_runtime is not None:
            self.use_gpu(gpu_runtime)
        self.debug = switch("EMBER_FUSION_DEBUG", False)
        # The fusers hold the records they are offered: one thread plans at a time.
        self._planning = threading.Lock()
        release = getattr(self.runtime, "release_later", None)  # from slot finalizers
        self.recycler = Recycler(release) if release and self.arrays is not None else None
        self._settled: dict[tuple, tuple] = {}  # run_settled's choices, by op and layouts

    def use_gpu(self, runtime) -> None:
        """Runs the blocks of CUDA values on ``runtime`` (a Triton runtime on CUDA)."""
        if self.inner.name != "torch":
            return
        self.gpu_runtime = runtime
        self.gpu_tuner = autotune.tuner_for(runtime)
        if not any(f.name == MatmulEpilogueFuser.name for f in self.explorer.fusers):
            # A new explorer: the fusers' names are part of every plan key it makes.
            fusers = [*self.explorer.fusers, MatmulEpilogueFuser(self.can_fuse_triton)]
            self.explorer = Explorer(fusers)

    def can_fuse(self, slot: Slot) -> bool:
        place = slot.device.place
        if place == "cpu":
            return self.arrays is not None
        return place == "cuda" and self.gpu_runtime is not None

    def can_fuse_triton(self, slot: Slot) -> bool:
        """Whether a slot's values reach a Triton runtime (the matmul epilogue's kernel)."""
        return self.can_fuse(slot) and takes_torch(self._route(slot.device.place)[0])

    def _route(self, place: str) -> tuple:
        """``(runtime, (to_array, from_array), tuner, recycler)`` for values on ``place``."""
        if place == "cuda":
            return self.gpu_runtime, (_same, _same), self.gpu_tuner, None
        return self.runtime, self.arrays, self.tuner, self.recycler

    def __call__(self, records: list[Record]) -> None:
        if self.arrays is None and self.gpu_runtime is None:
            counters.add("unfused_ops", len(records))
            for record in records:
                run_record(self.inner, record)
            return
        segments = self._blocks(records)
        if type(records) is ReplayedRecords and records.learn is not None \
                and len(records) == records.count:  # fmt: skip
            records.learn(records, segments)
        readers = None  # slot -> the records that read it: in-place writes, transposed products
        added = None  # product record -> the addition that takes it into its other operand
        done: set[int] = set()  # additions made by their products
        joined: dict[int, np.ndarray] = {}  # cat index -> the array its pieces were written in
        for start, length, fused in segments:
            if fused is None:
                if start in done:
                    continue
                record = records[start]
                if start in joined and self._join(record, joined.pop(start)):
                    continue
                if readers is None:
                    readers = readers_of(records)
                if record.name == "float_matmul":
                    if self._transposed_product(record, records, readers):
                        continue
                    if added is None:
                        added = accumulations(records, readers, segments)
                    j, views = added.get(start, (None, ()))
                    if j is not None and self.run_accumulated(record, records[j], views=views):
                        done.add(j)
                        continue
                self.run_single(record, readers, start + 1)
            elif type(fused) is ConvEpilogue:
                self._conv_epilogue(fused, records[start : start + length])
            elif type(fused) is MatmulEpilogue:
                self._matmul_epilogue(fused, records[start : start + length])
            elif type(fused) is Attention:
                if readers is None:
                    readers = readers_of(records)
                self._attention(fused, records[start : start + length],
                                reader_layout(fused.output, records, readers))  # fmt: skip
            elif type(fused) is AttentionGrad:
                if readers is None:
                    readers = readers_of(records)
                layouts = [reader_layout(s, records, readers)
                           for s in (fused.d_query, fused.d_key, fused.d_value)]  # fmt: skip
                take = self._gather(fused, records, readers, joined)
                self._attention_grad(fused, records[start : start + length], layouts, take)
            else:
                if readers is None:
                    readers = readers_of(records)
                self._launch(fused, records[start : start + length], readers, start + length)

    def _gather(self, fused: AttentionGrad, records: list[Record], readers: dict,
                joined: dict) -> Callable | None:  # fmt: skip
        """An allocator for an attention gradient's three results that lays them out in one
        pooled array as the cat that joins them (``joins``), which goes into ``joined`` by
        the cat's index; None where no cat joins them so, or a view cannot be made."""
        gather = None if self.recycler is None else joins.gathered(fused, records, readers)
        if gather is None:
            return None
        index, results = gather
        cat = records[index]
        shape = cat.outputs[0].shape
        dim = cat.args[1] % len(shape)
        array = self.runtime.pool.take(shape, numpy_dtype(cat.outputs[0].dtype))
        views = joins.piece_views(array, dim, [p.shape[dim] for p in cat.args[0]], results)
        if views is None:
            return None
        joined[index] = array
        return joins.taker(views)

    def _join(self, cat: Record, array: np.ndarray) -> bool:
        """Makes ``array`` the result of ``cat`` where its pieces lie side by side in it
        (:meth:`_gather`'s allocator made them), copying nothing; False, running nothing,
        where they do not (the attention ran record by record)."""
        shape = cat.outputs[0].shape
        pieces = [self.arrays[0](p.prim) for p in cat.args[0]]
        view = joins.joined_view(pieces, cat.args[1] % len(shape), shape)
        if (view is None or view.strides != array.strides
                or view.__array_interface__["data"][0] != array.__array_interface__["data"][0]):  # fmt: skip
            return False
        set_output(self.inner, cat.outputs[0], self.arrays[1](array), cat.name)
        cat.outputs[0].recycle = self.recycler
        counters.add("joined_in_place")
        return True

    def _transposed_product(self, record: Record, records: list[Record], readers: dict) -> bool:
        """Computes the product ``a @ b`` of ``record`` as ``(b^T @ a^T)^T`` where the one
        record of the stream that reads it swaps its last two dims (a second-order gradient
        through ``x @ w``: the backward of a transpose applied to a product). The product's
        slot holds the transposed view of a C-contiguous result, so the reader's transpose
        gives that result itself, and the ops after it (the sum with the weight's other
        gradient term) read contiguous memory instead of copying a transposed view (about
        1 ms for a ``[1024, 512]`` float32 operand on one core here). False where the rule
        does not apply. The product's values are the same; only its layout differs."""
        return read_transposed(record, records, readers) and self.run_transposed(record)

    def run_accumulated(self, product: Record, addition: Record, pooled: bool | None = None,
                        views: tuple[Slot, ...] = ()) -> bool:  # fmt: skip
        """Computes ``addition``'s sum of a value ``R`` and the product of ``product`` (found
        by :func:`accumulations`) as the numba GEMM adding into ``R``'s array in place, where
        ``R`` is a pooled output nothing else holds and the tuner chose the GEMM for the
        product: an input gradient's sum of a residual and a layer's term is then written
        once, instead of the product's output and the sum's each. The product's own slot
        gets no value (its one reader is the addition). False where the records are to run.
        ``pooled`` says ``R``'s array came from the runtime's pool where its slot cannot (a
        direct replay's values: the pool takes a buffer back when its last view dies);
        ``views`` are layout values of ``R`` that nothing reads any more (a reshape a weight
        gradient read), whose slots still hold views of its buffer."""
        from ember.backends.fusion.op_kernels import matmul_into

        kernel = self.op_kernels.get("float_matmul")
        if kernel is None or self.recycler is None:
            return False
        other = addend(addition, product.outputs[0])
        array = other.prim
        owned = other.recycle is self.recycler if pooled is None else pooled
        if (not owned or type(array) is not np.ndarray
                or not array.flags.c_contiguous or other.readable() or other.shared):  # fmt: skip
            return False
        held = sum(type(v.prim) is np.ndarray and v.prim.base is array.base for v in views)
        if _EXPECTED_REFS is None or _refs(array) != (_EXPECTED_REFS[0], _EXPECTED_REFS[1] + held):
            return False
        args = inner_args(product)
        if not kernel.supports(args):
            return False
        how = self.tuner.lookup_op(kernel.key(args), kernel.work(args))
        if type(how) is not autotune.Choice or how == autotune.UNFUSED:
            return False
        try:
            matmul_into(args, array, how.threads)
        except UnsupportedError:
            return False
        result = addition.outputs[0]
        set_output(self.inner, result, array, "a product added into its addend")
        if pooled is None:
            # The sum's slot holds and recycles the array now; the addend and its views,
            # read by nothing more, let it go (so the next term of a sum adds into it too).
            other.recycle, other.prim = None, None
            for view in views:
                view.prim = None
            result.recycle = self.recycler
        counters.add_each(op_kernels=1, fused_ops=2, in_place=1)
        return True

    def run_transposed(self, record: Record) -> bool:
        """Computes ``record``'s product transposed (see :meth:`_transposed_product`); False
        for a broadcast batch, which takes the usual product."""
        out = record.outputs[0]
        rank = len(out.shape)
        swap = last_two_swapped(rank)
        lhs, rhs = inner_args(record)
        inner = self.inner
        if len(inner.shape(lhs)) != rank or len(inner.shape(rhs)) != rank:
            return False
        product = inner.float_matmul(inner.float_permute(rhs, swap), inner.float_permute(lhs, swap))
        set_output(inner, out, inner.float_permute(product, swap), record.name)
        counters.add("unfused_ops")
        counters.add("transposed_products")
        return True

    def run_single(self, record: Record, readers: dict | None = None, end: int = 0) -> None:
        """Runs a record no block holds (or a small op at once): its compiled kernel where
        the tuner chose one, else the inner op. With ``readers`` (slot -> indices of the
        stream's records that read it) and ``end`` (the index after the record), an
        element-wise kernel may write over an input at its last use."""
        if record.name == "float_reshape" and self._pooled_reshape(record):
            return
        if self._lone_kernel(record, readers, end):
            return
        kernel = self.op_kernels.get(record.name)
        args = None if kernel is None else inner_args(record)
        if kernel is None or not self._run_op_kernel(kernel, record, args):
            counters.add("unfused_ops")
            if kernel is not None and kernel.blas:
                self.run_inner(kernel, lambda: run_record(self.inner, record), args)
            else:
                run_record(self.inner, record)

    def run_inner(self, kernel, run: Callable[[], Any], args: list | None = None) -> Any:
        """``run()``, an op on the inner backend that ``kernel`` (an ``op_kernels`` entry, or
        None) could have run: a BLAS product with the BLAS held to one thread where the
        runtime has workers of its own. OpenBLAS's threads spin for a long while after each
        product (on a 2-vCPU host, 50-200 ms later a 2-part kernel still ran 1.6x slower
        beside them), holding the cores the runtime's workers need; the tuner then weighs
        the product on one BLAS thread against the kernel on the runtime's threads (the
        ONNX encoder at two threads: 22.8 ms a forward against 24.4). A product of
        ``args`` under :data:`BLAS_THREADED_MIN` multiply-adds, which no BLAS splits, runs
        as it is: holding the BLAS cost 15 us a call on a cold cache (a classifier's
        ``[8, 64] @ [64, 10]``)."""
        if kernel is None or not self._holds_blas(kernel, args):
            return run()
        with blas_held_to_one():
            return run()

    def _holds_blas(self, kernel, args: list | None) -> bool:
        """Whether :meth:`run_inner` holds the BLAS to one thread for ``kernel``'s inner op
        on ``args`` (None: of any size)."""
        threads = getattr(self.runtime, "thread_count", None)
        return (kernel.blas and threads is not None and threads() >= 2
                and (args is None or kernel.work(args) >= BLAS_THREADED_MIN))  # fmt: skip

    def run_settled(self, name: str, kernel, args: list) -> tuple[Any, bool] | None:
        """``(result, pooled)`` of op ``name`` (an ``op_kernels`` op, ``kernel``) on the made
        NumPy values ``args`` (then its attributes), run as the tuner settled for their
        layouts: the compiled kernel into the pool's memory (``pooled``), or the inner op as
        :meth:`run_single` runs it. None, running nothing, where no choice is settled for
        them (the caller's record then times the candidates) or a value is not an array.

        What the choice hangs on (``supports``, ``key``, ``work``, the BLAS held or not) is
        kept per op, layouts and attributes while the tuner's generation holds: with the
        record's path around it, it cost about 20 us a product of a small model's step."""
        parts = [name]
        for arg in args:
            if type(arg) is np.ndarray:
                parts += (arg.shape, arg.strides, arg.dtype)
            else:
                parts.append(arg)
        key = tuple(parts)
        try:
            known = self._settled.get(key)
        except TypeError:  # an attribute that is not hashable
            return None
        generation = self.tuner.generation()
        if known is None or known[0] != generation:
            known = self._settle(kernel, args, generation)
            if known is None:
                return None
            if len(self._settled) >= MAX_SETTLED:  # shapes that keep changing: start over
                self._settled.clear()
            self._settled[key] = known
        _, threads, hold = known
        if threads:
            counters.add("op_kernels")
            return kernel.run(args, threads, self.runtime.pool.take), True
        counters.add("unfused_ops")
        op = getattr(self.inner, name)
        if hold:
            with blas_held_to_one():
                return op(*args), False
        return op(*args), False

    def _settle(self, kernel, args: list, generation: tuple) -> tuple | None:
        """``(generation, threads, hold)`` for :meth:`run_settled`: the kernel's thread
        count (0 for the inner op) and whether the inner op runs with the BLAS held to one
        thread; None while the tuner has not settled the choice or a value is not an
        array."""
        if any(type(a) is not np.ndarray for a in args if hasattr(a, "shape")):
            return None
        how = self._op_choice(kernel, args)
        if type(how) is autotune.Pending:
            return None
        if how is not None and how != autotune.UNFUSED:
            return generation, how.threads, False
        return generation, 0, self._holds_blas(kernel, args)

    def _op_choice(self, kernel, args: list) -> Any:
        """The tuner's answer for ``kernel`` on ``args``: a choice, pending, or None where
        the kernel does not take them or they are too small to time."""
        if not kernel.supports(args):
            return None
        return self.tuner.lookup_op(kernel.key(args), kernel.work(args))

    def _conv_epilogue(self, fused: ConvEpilogue, records: list[Record]) -> None:
        """Runs a convolution and its epilogue (``conv_epilogue``) in the numba kernel where
        the tuner chose that over the records one by one on the inner backend, timing the
        pair as a whole (the first run of a bucket is the kernel's, then both are timed:
        choosing NdArray's convolution alone also leaves the epilogue's ops unfused);
        otherwise (too small to time, a case the kernel refuses, an inner value read)
        record by record."""
        kernel = self.op_kernels["conv2d"]
        args = inner_args(fused.conv)
        how = None
        if kernel.supports(args) and not fused.inner_read:
            key = ("conv2d+epilogue", fused.residual is not None, *kernel.key(args))
            how = self.tuner.lookup_op(key, kernel.work(args))
        if how is not None and how != autotune.UNFUSED:
            pending = type(how) is autotune.Pending
            try:
                out = run_conv_epilogue(fused, args, 1 if pending else how.threads,
                                        self.runtime.pool.take)  # fmt: skip
            except UnsupportedError:
                pass
            else:
                set_output(self.inner, fused.output, out, "conv2d with its epilogue")
                if self.recycler is not None:
                    fused.output.recycle = self.recycler
                counters.add("op_kernels")
                counters.add("fused_ops", len(records) - 1)
                if pending:  # after the kept run: the candidates write into their own buffers
                    spare = _Spare()
                    self.tuner.tune_with(
                        how, lambda threads: run_conv_epilogue(fused, args, threads, spare),
                        lambda: run_detached(self.inner, records), "conv2d with its epilogue")  # fmt: skip
                return
        for record in records:
            self.run_single(record)

    def _attention(self, fused: Attention, records: list[Record],
                   order: tuple[int, ...] | None) -> None:  # fmt: skip
        """Runs an attention segment (``attention``) as the numba kernel (see
        :meth:`_attention_segment`), its output laid out in ``order`` (the permute of its
        one reader: the heads merged back are then a view)."""
        slots = (fused.output,) if fused.weights is None else (fused.output, fused.weights)
        key = ("attention", fused.mask is not None, fused.bias is not None,
               fused.weights is not None)  # fmt: skip

        def run(arrays, composed: bool, threads: int, take, laid_out: bool) -> list:
            return run_attention(fused, arrays, composed, threads, take,
                                 order if laid_out else None)  # fmt: skip

        scaling = None if fused.query_scaling is None else fused.query_scaling[0]
        self._attention_segment(fused, records, attention_arrays, key, 1, run, slots,
                                "attentions", "attention", own_prologue=scaling)  # fmt: skip

    def _attention_grad(self, fused: AttentionGrad, records: list[Record], layouts: list,
                        take: Callable | None = None) -> None:  # fmt: skip
        """Runs an attention gradient segment (``attention_grad``) as the numba kernel, then
        its epilogue's records (see :meth:`_attention_segment`); ``layouts`` are the orders
        to lay the three gradients out in (:func:`reader_layout`), or None each; ``take``
        makes the kernel's outputs in place of the pool (a direct replay's views of the
        array its readers join them into)."""

        def run(arrays, composed: bool, threads: int, take, laid_out: bool) -> list:
            return run_attention_grad(fused, arrays, threads, take,
                                      layouts if laid_out else None)  # fmt: skip

        self._attention_segment(fused, records, grad_arrays, ("attention_grad",
                                fused.mask is not None), 2, run,
                                (fused.d_query, fused.d_key, fused.d_value),
                                "attention_grads", "attention gradient", fused.epilogue,
                                take=take)  # fmt: skip

    def _attention_segment(self, fused, records: list[Record], arrays_of, key: tuple,
                           passes: int, run, slots: tuple, counter: str, what: str,
                           epilogue: tuple = (), own_prologue: Record | None = None,
                           take: Callable | None = None) -> None:  # fmt: skip
        """Runs an attention or attention gradient segment as its numba kernel where the
        tuner chose that over the records one by one (the first run of a bucket is the
        kernel's, then both are timed), then the ``epilogue``'s records; otherwise, where
        an inner value is read later, or for a case the kernel refuses, record by record.
        The kernel reads each operand as a view of its source through the prologue's
        layout steps (:meth:`_attention_operands`). ``run(arrays, composed, threads, take,
        laid_out)`` runs the kernel and returns the values of ``slots``; ``passes`` scales
        the tuner's work measure (the gradient's four products against two).
        ``own_prologue`` is a prologue record the kernel computes itself where the prologue
        runs (the query's scaling): its value follows ``slots``' among the results then."""
        if fused.inner_read or self.arrays is None:
            self._unfused(records)
            return
        arrays, composed, rest = self._attention_operands(fused, records, arrays_of, own_prologue)
        if not composed and own_prologue is not None:
            slots = (*slots, own_prologue.outputs[0])
        how = None
        if arrays is not None:
            q, k, v = arrays[:3]
            work = q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * (q.shape[3] + v.shape[3])
            how = self.tuner.lookup_op(key, passes * work)
        if how is None or how == autotune.UNFUSED:
            self._unfused(rest)
            return
        pending = type(how) is autotune.Pending
        try:
            results = run(arrays, composed, 1 if pending else how.threads,
                          take or self.runtime.pool.take, True)  # fmt: skip
        except UnsupportedError:
            self._unfused(rest)
            return
        for slot, array in zip(slots, results, strict=True):
            set_output(self.inner, slot, self.arrays[1](array), what)
            if self.recycler is not None:  # a result made by ``take`` is not the pool's own
                slot.recycle = self.recycler if take is None else None
        for record in epilogue:
            self.run_single(record)
        counters.add(counter)
        counters.add("fused_ops", len(rest) - len(epilogue))
        if pending:  # after the kept run: the candidates write into their own buffers
            inner = [r for r in rest if all(r is not e for e in epilogue)]
            spare = _Spare()
            self.tuner.tune_with(how, lambda threads: run(arrays, composed, threads, spare, False),
                                 lambda: run_detached(self.inner, inner), what)  # fmt: skip

    def _attention_operands(self, fused, records: list[Record], arrays_of,
                            own_prologue: Record | None) -> tuple:  # fmt: skip
        """``(arrays, composed, rest)`` for an attention segment: its kernel's operands
        (``arrays_of(fused, to_numpy, composed)``, None where the kernel cannot read them)
        composed from their sources through the prologue's layout steps, or, where a
        prologue value is read later or no single view exists, read after the prologue's
        records ran (all but ``own_prologue``, the kernel's); ``rest`` are the segment's
        records that have not run."""
        to_numpy = self.arrays[0]
        composed = not fused.prologue_kept
        arrays = arrays_of(fused, to_numpy, True) if composed else None
        ran = set()
        if arrays is None:
            composed = False
            for record in fused.prologue:
                if record is not own_prologue:
                    self.run_single(record)
                    ran.add(id(record))
            arrays = arrays_of(fused, to_numpy, False)
        return arrays, composed, [r for r in records if id(r) not in ran]

    def _matmul_epilogue(self, fused: MatmulEpilogue, records: list[Record]) -> None:
        """Runs a matmul and its epilogue (``matmul_epilogue``) as one Triton kernel where
        the tuner chose it over the records one by one (the first run of a bucket is the
        kernel, then both are timed), or where there is no tuner (Triton's interpreter);
        otherwise, or for a case the kernel refuses, record by record. On NdArray values it
        is a product and its bias (:meth:`run_biased`)."""
        place = fused.matmul.outputs[0].device.place
        if place == "cpu" and "float_matmul" in self.op_kernels:
            self.run_biased(fused.matmul, records[1], fused.keep_value)
            return
        slots = (*fused.matmul.inputs, *fused.inputs)
        if any(s.device.place != place for s in slots) or not self.can_fuse_triton(slots[0]):
            self._unfused(records)
            return
        runtime, _, tuner, _ = self._route(place)
        a, b = inner_args(fused.matmul)[:2]
        others = [s.prim for i, s in enumerate(fused.inputs) if i != fused.value]
        m, n = fused.block.shape[-2], fused.block.shape[-1]
        work = (math.prod(fused.block.shape[:-2]) * m * n * a.shape[-1]) or 1
        how = None
        if tuner is not None:
            how = tuner.lookup_op(("matmul_epilogue", fused.keep_value, fused.value,
                                   fused.block.key()), work)  # fmt: skip
            if how is None or how == autotune.UNFUSED:
                self._unfused(records)
                return

        def run(config=None) -> list:
            return runtime.run_matmul(fused.block, fused.value, a, b, others, fused.keep_value,
                                      config)  # fmt: skip

        try:
            results = run(how.setting if type(how) is autotune.Choice else None)
        except UnsupportedError:
            self._unfused(records)
            return
        slots = list(fused.outputs)
        if fused.keep_value:
            slots.append(fused.matmul.outputs[0])
        for slot, prim in zip(slots, results, strict=True):
            set_output(self.inner, slot, prim, "a matmul with its epilogue")
        counters.add("kernels")
        counters.add("fused_ops", len(records))
        if type(how) is autotune.Pending:
            labels = [c.label for c in runtime.configs_of("matmul")]
            tuner.tune_configs(how, labels, run, lambda: run_detached(self.inner, records),
                               f"matmul {list(fused.block.shape)}")  # fmt: skip

    def run_biased(self, product: Record, addition: Record, keep_value: bool) -> None:
        """Runs a product and the addition of its bias (``BiasedMatmulFuser``) as the numba
        GEMM with the bias, where the tuner chose that over the two records (the first run
        of a bucket is the kernel's, then both are timed); otherwise, where the product is
        read after the segment (``keep_value``), or for a case the kernel refuses, record
        by record."""
        from ember.backends.fusion.op_kernels import matmul_with_bias

        kernel = self.op_kernels["float_matmul"]
        records = [product, addition]
        args = inner_args(product)
        bias = addend(addition, product.outputs[0]).prim
        how = None
        if not keep_value and kernel.supports(args) and type(bias) is np.ndarray:
            how = self.tuner.lookup_op(("matmul+bias", *kernel.key(args)), kernel.work(args))
        if how is None or how == autotune.UNFUSED:
            for record in records:
                self.run_single(record)
            return
        pending = type(how) is autotune.Pending
        try:
            out = matmul_with_bias(args, bias, 1 if pending else how.threads,
                                   self.runtime.pool.take)  # fmt: skip
        except UnsupportedError:
            for record in records:
                self.run_single(record)
            return
        slot = addition.outputs[0]
        set_output(self.inner, slot, out, "a matmul with its bias")
        if self.recycler is not None:
            slot.recycle = self.recycler
        counters.add("op_kernels")
        counters.add("fused_ops", len(records))
        if pending:
            spare = _Spare()
            self.tuner.tune_with(
                how, lambda threads: matmul_with_bias(args, bias, threads, spare),
                lambda: self.run_inner(kernel, lambda: run_detached(self.inner, records)),
                "matmul+bias")  # fmt: skip

    def _blocks(self, records: list[Record]) -> list:
        """``(start, length, fused block or None)`` of each segment of the stream's plan.

        A stream whose plan key was built before binds that build's templates (no fuser
        runs); otherwise the fusers build each segment of the (cached or explored) plan,
        and their templates are remembered for the key.
        """
        replayed = type(records) is ReplayedRecords and len(records) == records.count
        if replayed:
            # One replay's records: the plan its trace's flushes had, without the key.
            readable = tuple([o.readable() for r in records for o in r.outputs])
            found = records.plans.get((records.pushed, readable))
            if found is not None and found[0] == Explorer.generation():
                if found[1] is None:
                    return [(i, 1, None) for i in range(len(records))]
                segments = _bind(found[1], records)
                if segments is not None:
                    counters.add("cache_hits")
                    return segments
        generation = Explorer.generation()
        if self.explorer.nothing_to_fuse(records):
            templates = None
            segments = [(i, 1, None) for i in range(len(records))]
        else:
            key = self.explorer.key(records)
            templates = self.explorer.built(key)
            segments = None if templates is None else _bind(templates, records)
            if segments is not None:
                counters.add("cache_hits")
            else:
                with self._planning:
                    try:
                        segments = self._fuse(records, key)
                    finally:
                        for fuser in self.explorer.fusers:
                            fuser.reset()  # the records (and so the values) they held can go
                templates = self.explorer.built(key)
                if templates is None:
                    return segments  # a build without templates: planned anew each time
        if replayed:
            if len(records.plans) >= MAX_REPLAYED_PLANS:
                records.plans.clear()
            records.plans[(records.pushed, readable)] = (generation, templates)
        return segments

    def _fuse(self, records: list[Record], key: tuple) -> list:
        last_read = {}
        for i, record in enumerate(records):
            for s in record.inputs:
                last_read[s.id] = i
        templates: list = []
        complete = True

        def build(plan) -> list | None:
            nonlocal complete
            segments = []
            templates.clear()
            complete = True
            for segment in plan:
                if segment.fuser is None:
                    segments.append((segment.start, 1, None))
                    templates.append((segment.start, 1, None))
                    continue
                fuser = self.explorer.fuser_for(segment, records)
                if len(fuser) != segment.length:
                    return None  # a cached plan that does not fit this stream
                end = segment.start + segment.length
                # Which outputs to write depends only on the key (its sources and readable
                # outputs), so a template may keep the decision.
                keep = {
                    o.id
                    for r in records[segment.start : end]
                    for o in r.outputs
                    if last_read.get(o.id, -1) >= end or o.readable()
                }
                fused = fuser.finish(keep)
                segments.append((segment.start, segment.length, fused))
                make = getattr(fuser, "template", None)
                if make is None:
                    complete = False  # a fuser without templates: every stream fuses anew
                else:
                    templates.append((segment.start, segment.length, make(fused)))
            return segments

        from ember.backends.fusion import plans

        if self.explorer.cached(key) is None:  # an earlier process's plan, from disk?
            stored = plans.load(key, len(records), len(self.explorer.fusers))
            if stored is not None:
                segments = build(stored.plan)
                # Trusted only when the fusers make exactly its templates from its plan.
                if segments is not None and complete and tuple(templates) == stored.templates:
                    self.explorer.adopt(key, stored.plan, tuple(templates))
                    plans.adopted(key)
                    return segments
                plans.ignore(key, "the fusers build other blocks from its plan")
        segments = self.explorer.build(records, build, key)
        if complete:
            self.explorer.remember(key, tuple(templates))
            # Only element-wise templates have a disk form: a stream with a convolution
            # epilogue or an attention is planned anew once per process (about a millisecond).
            if not any(type(t) in _NO_DISK_FORM for _, _, t in templates):
                plans.save(key, self.explorer.cached(key), tuple(templates))
        return segments

    def _launch(self, fused, records: list[Record], readers: dict | None = None,
                end: int = 0) -> None:  # fmt: skip
        """Runs a fused block (``records``, which end before record ``end`` of their stream;
        ``readers`` maps each slot to the records of the stream that read it, by index)."""
        block = fused.block
        n_records = len(records)
        if not block.outputs:
            return  # nobody can read what it computes
        place = fused.outputs[0].device.place
        # Values on two devices (the inner op says what is wrong), or a template planned
        # for another device's stream (plan keys do not hold places) where no runtime is.
        if any(s.device.place != place for s in fused.inputs) or not self.can_fuse(
            fused.outputs[0]
        ):
            self._unfused(records)
            return
        runtime, (to_numpy, from_numpy), tuner, recycler = self._route(place)
        how = tuner.lookup(block) if tuner is not None else None
        if how == autotune.UNFUSED:  # its ops ran faster one by one when timed
            if self.debug:
                print(f"[ember.fusion] block of {n_records} ops shape {list(block.shape)} "
                      "runs unfused (autotune)", file=sys.stderr)  # fmt: skip
            self._unfused(records)
            return
        out, consumed = None, []
        if recycler is not None and readers is not None and type(how) is not autotune.Pending:
            out, consumed = self._in_place(fused, readers, end)
        arrays = [to_numpy(s.prim).reshape(i.shape) for s, i in zip(fused.inputs, block.inputs)]
        started = time.perf_counter()
        try:
            if type(how) is autotune.Choice:
                results = runtime.run(block, arrays, out, how.setting)
            else:  # untuned, or not tuned yet: the runtime's own choice
                results = runtime.run(block, arrays, out)
        except UnsupportedError:  # a dtype or op the runtime does not compile: run unfused
            self._unfused(records)
            return
        for slot in consumed:
            slot.prim = None  # overwritten: a read that cannot happen would raise, not misread
        counters.add("fused_ops", n_records)
        counters.add("kernels")
        for slot, array in zip(fused.outputs, results, strict=True):
            if tuple(array.shape) != slot.shape:
                array = array.reshape(slot.shape)
            prim = from_numpy(array)
            set_output(self.inner, slot, prim, "a fused block")
            if prim is array and recycler is not None:
                slot.recycle = recycler
        if self.debug:
            ops = " ".join(i.op for i in block.body)
            print(f"[ember.fusion] block of {n_records} ops ({ops}) shape {list(block.shape)} "
                  f"{len(block.inputs)} in / {len(block.outputs)} out, "
                  f"{(time.perf_counter() - started) * 1e3:.3f} ms", file=sys.stderr)  # fmt: skip
        if type(how) is autotune.Pending:
            # After the kept run (which compiled the kernel): the candidates write into
            # buffers of their own, so the outputs stored above stay as they are.
            tuner.tune(how, block, arrays, lambda: run_detached(self.inner, records))

    def _in_place(self, fused, readers: dict, end: int) -> tuple[list | None, list]:
        """``(out, consumed)``: for an element-wise float block, output arrays (None where
        the pool gives one) that overwrite inputs at their last use, and the input slots
        they consume; ``(None, [])`` when no input qualifies.

        An input qualifies when it is a pooled output of an earlier block (its slot
        recycles it, so reference counts prove, as :class:`Recycler` does, that no other
        slot or view holds the array), no handle can read it, no record of another stream
        reads it, no later record of this stream reads it, and it has the output's shape,
        dtype and C-contiguous layout (a product of a permuted stack, an attention's context
        are pooled in their readers' order). An element-wise kernel
        reads each element before it writes that position, so it may write over its
        input. The consumed slots hand their arrays to the outputs' slots.
        """
        block = fused.block
        if block.axis is not None or not all(i.dtype.is_float for i in block.body):
            return None, []  # a reduction's passes read inputs again; int pow may fail late
        out: list = []
        consumed: list[Slot] = []
        for r in block.outputs:
            shape, dtype, array = block.register_shape(r), block.register_dtype(r), None
            for slot, spec in zip(fused.inputs, block.inputs):
                if slot.recycle is not self.recycler or spec.dtype is not dtype:
                    continue
                array = slot.prim
                fits = (type(array) is np.ndarray and array.shape == shape
                        and array.flags.c_contiguous  # not a pooled array laid out in another order
                        and spec.shape == shape and not slot.readable() and not slot.shared
                        and slot not in consumed and _refs(array) == _EXPECTED_REFS
                        and readers.get(slot, (-1,))[-1] < end)  # fmt: skip
                if fits:
                    consumed.append(slot)
                    break
                array = None
            out.append(array)
        if not consumed:
            return None, []
        for slot in consumed:
            slot.recycle = None  # the output's slot recycles the array now
        counters.add("in_place", len(consumed))
        return out, consumed

    def _run_op_kernel(self, kernel, record: Record, args: list) -> bool:
        """Runs ``record`` (its inner arguments ``args``) with its compiled kernel where the
        tuner chose it, or on the first use of its bucket (then times it against the inner
        op, as a fused block's first run is kept and then timed: every later run of the
        bucket computes what the chosen candidate computes, in a kernel's rounding from the
        start where it wins); False when the inner op is to run (not chosen, too small to
        time, or a case the kernel does not take)."""
        how = self._op_choice(kernel, args)
        if how is None or how == autotune.UNFUSED:
            return False
        pending = type(how) is autotune.Pending
        try:
            # On the first use this compiles (or loads) the kernel before the timing.
            out = kernel.run(args, 1 if pending else how.threads, self.runtime.pool.take)
        except UnsupportedError:
            return False
        outs = out if record.multi else (out,)
        for slot, prim in zip(record.outputs, outs, strict=True):
            set_output(self.inner, slot, prim, record.name)
            if self.recycler is not None:
                slot.recycle = self.recycler  # pooled outputs go back (others are ignored)
        counters.add("op_kernels")
        if pending:
            # After the kept run: the candidates write into buffers of their own, mapped by
            # the first run (fresh pages on every run cost a 3 MB product a millisecond, and
            # the inner op, timed after, finds the allocator's memory mapped already).
            inner_op = getattr(self.inner, record.name)
            spare = _Spare()
            self.tuner.tune_with(how, lambda threads: kernel.run(args, threads, spare),
                                 lambda: self.run_inner(kernel, lambda: inner_op(*args)),
                                 record.name)  # fmt: skip
        return True

    def _lone_kernel(self, record: Record, readers: dict | None, end: int) -> bool:
        """Runs a large element-wise op that no block holds (a bias added after a product
        and a reshape, whose readers are layout ops) as a kernel of its own, where the tuner
        chose that over the inner op: on every core, into pooled memory, where NumPy's op
        runs on one thread. False where the inner op is to run: a small, multi-output or
        non-element-wise op, or values no runtime takes."""
        if record.multi or self.arrays is None:
            return False
        out = record.outputs[0]
        if not lone_kernel_size(record, out.shape) or out.device.place != "cpu":
            return False
        fuser = ElementwiseFuser(self.can_fuse)  # its own: other threads plan meanwhile
        fuser.fuse(record)
        if not fuser.records:
            return False
        self._launch(fuser.finish({out.id}), [record], readers, end)
        return out.prim is not None

    def _pooled_reshape(self, record: Record) -> bool:
        """Runs a reshape that must copy (of a permuted view, as attention's heads are
        merged) into a buffer of the pool, as fused blocks write theirs: NumPy's copy goes
        to fresh memory, whose page faults cost more than the copy (a 1 MiB copy: 0.37 ms
        into fresh pages). False where the inner op is to run: a view, a small value,
        no pool."""
        x = record.inputs[0].prim
        if (self.recycler is None or type(x) is not np.ndarray or x.size < POOLED_COPY_MIN
                or x.flags.c_contiguous):  # fmt: skip
            return False
        slot = record.outputs[0]
        if reshape_view(x, slot.shape) is not None:
            return False
        out = self.runtime.pool.take(slot.shape, x.dtype)
        np.copyto(out.reshape(x.shape), x)
        set_output(self.inner, slot, out, record.name)
        slot.recycle = self.recycler
        counters.add("unfused_ops")
        return True

    def _unfused(self, records: list[Record]) -> None:
        counters.add("unfused_ops", len(records))
        for record in records:
            run_record(self.inner, record)


class _Spare:
    """``empty(shape, dtype)`` for a tuning's candidates: one array per shape and dtype,
    handed out again on every call (nothing reads what a candidate writes), as the pool
    hands out mapped memory in production. Fresh pages on every run cost as much as a small
    kernel and do not shrink with threads (the kernel's page faults queue on one lock): on
    them the ONNX CNN's 1x1 convolution timed 0.21 ms at one and at two threads, and was
    left on one, where in the model it runs in 0.15 ms at two against 0.23 at one."""

    def __init__(self) -> None:
        self.arrays: dict[tuple, np.ndarray] = {}

    def __call__(self, shape: tuple[int, ...], dtype,
                 order: tuple[int, ...] | None = None) -> np.ndarray:  # fmt: skip
        key = (tuple(shape), np.dtype(dtype), order)
        found = self.arrays.get(key)
        if found is None:
            found = self.arrays[key] = empty_in_order(shape, dtype, order)
        return found


_NO_DISK_FORM = (EpilogueTemplate, MatmulTemplate, AttentionTemplate)

MAX_REPLAYED_PLANS = 8
"""Plans a trace keeps for its replays' flushes (variants: an entry that ran at once, an
output the caller dropped); more, and it forgets them all."""

MAX_SETTLED = 4096
"""Layouts ``Executor.run_settled`` keeps choices for, at most."""
BLAS_THREADED_MIN = 1 << 16
"""Multiply-adds of a product below which a BLAS runs it on one thread anyway (OpenBLAS
splits a GEMM from 4 times as many), so ``Executor.run_inner`` does not hold its threads."""
LONE_KERNEL_MIN = 1 << 18
"""Elements, at least, of an element-wise op no block holds that runs as a kernel of its
own (``Executor._lone_kernel``): below, launching costs more than a second core saves."""


def lone_kernel_size(record: Any, shape: tuple[int, ...]) -> bool:
    """Whether ``record`` (a record, or a trace entry: anything with its ``op``) is an
    element-wise op whose output ``shape`` is large enough to run as a kernel of its own
    (``Executor._lone_kernel``, where the values allow)."""
    return math.prod(shape) >= LONE_KERNEL_MIN and elementwise(record)


def runs_inner(record: Any, shape: tuple[int, ...]) -> bool:
    """Whether ``Executor.run_single`` runs ``record`` (of output ``shape``), whatever its
    values, as the inner op: not a reshape that may copy into the pool (of
    :data:`POOLED_COPY_MIN` elements or more), nor an op that may run as a kernel of its
    own; an op with a compiled kernel, once the tuner left it to the inner backend."""
    if record.name == "float_reshape":
        return math.prod(shape) < POOLED_COPY_MIN
    return not lone_kernel_size(record, shape)


POOLED_COPY_MIN = 1 << 16
"""Elements, at least, of a reshape's copy that goes into a pooled buffer."""


def reshape_view(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``x`` reshaped without a copy, or None where the reshape must copy."""
    try:
        return np.reshape(x, shape, copy=False)  # NumPy 2.1+: a ValueError where it must copy
    except ValueError:
        return None
    except TypeError:  # an older NumPy: no copy= argument
        view = x.view()
        try:
            view.shape = shape
        except AttributeError:
            return None
        return view


def read_transposed(record: Record, records: list[Record], readers: dict) -> bool:
    """Whether the product ``record`` has one reader, which swaps its last two dims, and no
    handle or other stream reads it (``Executor._transposed_product``)."""
    out = record.outputs[0]
    found = readers.get(out)
    if found is None or len(found) != 1 or out.readable() or out.shared:
        return False
    reader = records[found[0]]
    return reader.name == "float_permute" and tuple(reader.args[1]) == last_two_swapped(
        len(out.shape))  # fmt: skip


def addend(addition: Record, term: Slot) -> Slot:
    """The operand of a two-input ``addition`` other than ``term``."""
    first, second = addition.inputs
    return second if first is term else first


def accumulations(records: list[Record], readers: dict, segments: list) -> dict[int, tuple]:
    """``{i: (j, views)}``: products (record ``i``, a segment of its own) whose one reader
    is the addition ``j`` (a segment of its own too) of a value ``R`` made before ``i`` and
    read by no record from ``i`` on but ``j``, of the product's shape and dtype: ``R``'s
    array may take the product's sum in place at ``i`` (``Executor.run_accumulated``).
    ``views`` are the layout values made from ``R`` (through layout steps) that no handle,
    other stream or record from ``i`` on reads. What only the values can say (``R``
    pooled, held by nothing else) is checked when it runs."""
    singles = {start for start, _, fused in segments if fused is None}
    made_at = {o: i for i, r in enumerate(records) for o in r.outputs}
    found = {}
    for i in singles:
        product = records[i]
        if product.name != "float_matmul":
            continue
        out = product.outputs[0]
        reading = readers.get(out)
        if reading is None or len(reading) != 1 or out.readable() or out.shared:
            continue
        j = reading[0]
        addition = records[j]
        if j not in singles or addition.name != "float_add" or len(addition.inputs) != 2:
            continue
        other = addend(addition, out)
        if other is out or other.shape != out.shape or other.dtype is not out.dtype:
            continue
        if addition.outputs[0].shape != out.shape or made_at.get(other, -1) >= i:
            continue
        if readers[other][-1] == j and all(k < i for k in readers[other][:-1]):
            views = _dead_views(other, records, readers, i)
            if views is not None:
                found[i] = (j, views)
    return found


def _dead_views(slot: Slot, records: list[Record], readers: dict, before: int) -> tuple | None:
    """The layout values made from ``slot`` (transitively) by the records, where none is
    read from record ``before`` on, by a handle or by another stream; else None."""
    views, todo = [], [slot]
    while todo:
        source = todo.pop()
        for k in readers.get(source, ()):
            record = records[k]
            if record.name not in VIEW_OPS or k >= before:
                continue
            view = record.outputs[0]
            if view.readable() or view.shared or any(r >= before for r in readers.get(view, ())):
                return None
            views.append(view)
            todo.append(view)
    return tuple(views)


def reader_layout(slot: Slot, records: list[Record], readers: dict) -> tuple | None:
    """The order of dims to lay ``slot``'s value out in so that the permutes its readers
    apply give a C-contiguous value (heads merged back: the reshape after them is then a
    view), or None. It follows the chain of single readers that are permutes or scalings
    (which keep their input's layout), while no handle holds a value on it."""
    order = None
    for _, _, reader in single_readers(slot, records, readers):
        if reader.name == "float_permute":
            axes = tuple(reader.args[1])
            order = axes if order is None else tuple(order[a] for a in axes)
        elif reader.name not in _LAYOUT_KEEPING or len(reader.inputs) != 1:
            break
    return order


def single_readers(slot: Slot, records: list[Record], readers: dict):
    """The records that read ``slot``'s value, then their result, one after another:
    ``(value, index of its reader, reader)`` while the value has one reader in ``records``
    and no handle holds it."""
    while True:
        found = readers.get(slot)
        if found is None or len(found) != 1 or slot.readable() or slot.shared:
            return
        reader = records[found[0]]
        yield slot, found[0], reader
        slot = reader.outputs[0]


_LAYOUT_KEEPING = frozenset({"float_mul_scalar", "float_div_scalar", "float_neg"})
"""Element-wise ops of one operand whose results keep their input's layout."""


def readers_of(records: list[Record]) -> dict:
    """Each slot the records read, mapped to the indices of the records that read it, in
    order (the last is its last use)."""
    found: dict = {}
    for i, record in enumerate(records):
        for slot in record.inputs:
            found.setdefault(slot, []).append(i)
    return found


def _bind(templates: tuple, records: list[Record]) -> list | None:
    """The segments of ``records`` from a build's templates, or None when a block's sizes
    do not fit (the fusers then decide)."""
    segments = []
    for start, length, template in templates:
        if template is None:
            segments.append((start, 1, None))
            continue
        fused = template.bind(records[start : start + length])
        if fused is None:
            return None
        segments.append((start, length, fused))
    return segments


class Recycler:
    """Hands a fused block's output buffer back to the runtime's pool when its slot is
    collected (no handle, record or slot can read it any more) and nothing else holds the
    array or a view of it.

    The pool's buffers are loaned out as ``raw[:n].view(dtype).reshape(shape)``: every
    NumPy view of the loaned array has ``raw`` as its ``base``, and a torch tensor, a
    memoryview or another slot sharing it holds the array itself. So when the reference
    counts of the array and of ``raw`` are exactly those of the slot and the pool's own
    record, no one else can read the memory. The expected counts are measured once on a
    probe held the same way (:func:`_probe_refs`), not assumed.
    """

    def __init__(self, release) -> None:
        self.release = release

    def __call__(self, slot: Slot) -> None:
        try:
            array = slot.prim
            if type(array) is np.ndarray and _refs(array) == _EXPECTED_REFS:
                self.release(array)
        except Exception:  # a finalizer must not raise (at interpreter shutdown, say)
            pass


def _refs(array: np.ndarray) -> tuple[int, int] | None:
    """The reference counts of ``array`` and of the buffer it views (None when it owns its
    memory or views something other than a NumPy buffer)."""
    if type(array.base) is not np.ndarray or array.base.base is not None:
        return None
    return sys.getrefcount(array), sys.getrefcount(array.base)


def _probe_refs() -> tuple[int, int] | None:
    """The counts :meth:`Recycler.__call__` sees for an array held only by a slot, viewing a
    buffer held only by the array and a pool's record of the loan."""
    raw = np.empty(16, np.uint8)
    loans = {0: raw}  # the pool's record of the loan
    slot = Slot((16,), None, None, prim=raw[:16].view(np.uint8).reshape(16))
    del raw
    array = slot.prim
    refs = _refs(array)
    del loans
    return refs


_EXPECTED_REFS = _probe_refs()


def numpy_bridge(inner: Backend):
    """``(to_numpy, from_numpy)`` without copies for ``inner``'s CPU values, or None."""
    if inner.name == "ndarray":
        return _same, _same
    if inner.name == "torch":
        import torch

        def from_numpy(array):
            return torch.from_numpy(array if array.flags.writeable else array.copy())

        return _torch_numpy, from_numpy
    return None


def _same(x):
    return x


def _torch_numpy(x):
    return x.detach().numpy()
