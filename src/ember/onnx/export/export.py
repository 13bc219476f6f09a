"""``ember.onnx.export``: an ember module to an ONNX file.

The module's forward on the example inputs is traced through the op table
(:mod:`ember.onnx.export.tracer`); each recorded op is written in its ONNX form by its
exporter (:mod:`ember.onnx.export.rules`); the model is checked with ``onnx.checker`` and
written atomically.

Dynamic axes: the forward is traced a second time with every dynamic dim at another size
(each input's values repeated along it). The two traces must run the same ops; every
shape attribute that differs between them is written symbolically: ``-1`` for the one
entry of a reshape that changes, ``1`` where an expand keeps its input's size, a slice
end at a dim's end as "to the end", and otherwise a formula of the dynamic input dims
(``Shape`` / ``Gather`` / ``Mul`` / ``Concat``; see :mod:`ember.onnx.export.symbolic`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ember.atomic import atomic_write
from ember.backend.errors import BackendUnavailableError
from ember.module import Module
from ember.onnx.export.errors import ExportError, ExportFileError
from ember.onnx.export.registry import module_rule_for, rule_for
from ember.onnx.export.symbolic import DynamicDim
from ember.onnx.export.tracer import Trace
from ember.onnx.export.tracer import trace as trace_forward
from ember.tensor import Tensor

MIN_OPSET = 13
"""The oldest default-domain opset export writes (Softmax's per-dim ``axis``, ReduceSum's
axes input)."""


def export(module: Module, example_inputs: Tensor | Sequence[Any], path: str | os.PathLike,
           dynamic_axes: Mapping[str, Mapping[int, str]] | None = None, opset: int = 17,
           input_names: Sequence[str] | None = None, output_names: Sequence[str] | None = None,
           *, value_info: bool = True) -> Path:  # fmt: skip
    """Writes ``module``'s forward on ``example_inputs`` as an ONNX model at ``path``.

    Args:
        module: the model. On an autodiff device its ``valid()`` twin is exported (dropout
            off, batch norm on its running statistics).
        example_inputs: a tensor or a sequence of the forward's arguments; each tensor
            becomes a graph input (other arguments are baked in).
        path: the ``.onnx`` file to write (its folder must exist).
        dynamic_axes: per input (or output) name, the dims whose size may change, with a
            name for each: ``{"images": {0: "batch"}}``.
        opset: the default-domain opset version (at least 13).
        input_names: the graph inputs' names; default ``input`` (``input_0``, ... for several).
        output_names: the graph outputs' names; default ``output`` (``output_0``, ...).
        value_info: annotate each op's output in the graph with its dtype and shape as
            traced, dynamic dims by name (viewers show them).

    Returns:
        the path written.

    Raises:
        UnsupportedExportError: an op without an ONNX form; it names the op and the module
            path where it ran.
        ExportError: a forward that cannot be exported (it reads values to branch on, or
            runs other ops at other sizes of a dynamic axis), or bad arguments.
        ExportFileError: the file cannot be written; nothing is left at ``path``.
        BackendUnavailableError: the ``onnx`` package is not installed.

    Example:
        >>> import tempfile, ember
        >>> from ember import Tensor
        >>> from ember.nn.linear import LinearConfig
        >>> device = ember.device("ndarray")
        >>> model = LinearConfig(4, 2).init(device)
        >>> path = export(model, Tensor.zeros([3, 4], device), tempfile.mkdtemp() + "/m.onnx",
        ...               dynamic_axes={"input": {0: "batch"}})
        >>> path.name
        'm.onnx'
    """
    onnx = _require_onnx()
    from ember.onnx.export.graph import build_model  # writes onnx protos

    if not isinstance(opset, int) or not MIN_OPSET <= opset <= onnx.defs.onnx_opset_version():
        raise ExportError(f"ONNX export: opset {opset!r} is not between {MIN_OPSET} and "
                          f"{onnx.defs.onnx_opset_version()} (this onnx package's newest)")
    args = (example_inputs,) if isinstance(example_inputs, Tensor) else tuple(example_inputs)
    n_inputs = sum(isinstance(a, Tensor) for a in args)
    inputs = _names(input_names, n_inputs, "input")
    dynamic_axes = {k: dict(v) for k, v in (dynamic_axes or {}).items()}

    def has_form(op) -> bool:
        return any(rule_for(op.name, kind, opset) is not None for kind in op.kinds)

    def whole(layer: Module) -> bool:
        return module_rule_for(layer) is not None

    def trace(model: Module, example: Sequence[Any]) -> Trace:
        return trace_forward(model, example, has_form, whole)

    main = trace(module, args)
    outputs = _names(output_names, len(main.outputs), "output")
    if set(inputs) & set(outputs):
        raise ExportError(f"ONNX export: {sorted(set(inputs) & set(outputs))} name both an input "
                          f"and an output; choose other input_names / output_names")
    unknown = set(dynamic_axes) - set(inputs) - set(outputs)
    if unknown:
        raise ExportError(f"ONNX export: dynamic_axes names {sorted(unknown)}, which are not "
                          f"input or output names ({inputs + outputs})")
    if main.reads:
        _check_no_branch_on_data(main, trace(module, _other_values(args)))
    dynamic = _dynamic_dims(dynamic_axes, inputs, main)
    alternate = None
    if dynamic:
        alternate = trace(module, _resized(args, inputs, dynamic))
        _check_aligned(main, alternate)
    model = build_model(main, alternate, opset=opset, input_names=inputs, output_names=outputs,
                        dynamic=dynamic, dynamic_axes=dynamic_axes, value_info=value_info)  # fmt: skip
    try:
        onnx.checker.check_model(model, full_check=True)  # shape inference included
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        raise ExportError(f"ONNX export: the exported model does not pass onnx.checker "
                          f"(an exporter wrote an invalid node): {error}") from error
    return _write(model, Path(path))


def _require_onnx() -> Any:
    """The ``onnx`` package, or an error saying how to install it (it is an optional extra,
    so ``import ember.onnx.export`` works without it)."""
    try:
        import onnx
    except ImportError:
        raise BackendUnavailableError("ONNX export needs the onnx package: pip install "
                                      "'ember[onnx]' (or pip install onnx)") from None
    return onnx


def _names(given: Sequence[str] | None, count: int, stem: str) -> list[str]:
    if given is None:
        return [stem] if count == 1 else [f"{stem}_{i}" for i in range(count)]
    names = list(given)
    if len(names) != count or len(set(names)) != count or not all(
            isinstance(n, str) and n for n in names):  # fmt: skip
        raise ExportError(f"ONNX export: {count} distinct non-empty {stem} names are needed, "
                          f"got {names!r}")
    return names


def _dynamic_dims(dynamic_axes: dict[str, dict[int, str]], inputs: list[str],
                  main: Trace) -> list[DynamicDim]:  # fmt: skip
    """The dynamic input dims, with a second size per dim name (distinct names get
    distinct sizes, so a formula cannot mistake one for another)."""
    sizes: dict[str, tuple[int, int]] = {}
    found = []
    for i, name in enumerate(inputs):
        shape = main.input_avals[i].shape
        for axis, dim_name in dynamic_axes.get(name, {}).items():
            if not isinstance(axis, int) or not -len(shape) <= axis < len(shape):
                raise ExportError(f"ONNX export: dynamic axis {axis!r} of input {name!r} is not "
                                  f"a dim of its shape {list(shape)}")
            if not isinstance(dim_name, str) or not dim_name.isidentifier():
                raise ExportError(f"ONNX export: dynamic axis {axis} of input {name!r} needs a "
                                  f"name (an identifier such as 'batch'), got {dim_name!r}")
            axis %= len(shape)
            traced = shape[axis]
            if dim_name in sizes and sizes[dim_name][0] != traced:
                raise ExportError(f"ONNX export: dynamic dim {dim_name!r} has size "
                                  f"{sizes[dim_name][0]} in one input and {traced} in {name!r}")
            sizes.setdefault(dim_name, (traced, traced + 2 + len(sizes)))
            found.append(DynamicDim(name, axis, dim_name, *sizes[dim_name]))
    return found


def _resized(args: tuple, inputs: list[str], dynamic: list[DynamicDim]) -> list[Any]:
    """The example inputs with each dynamic dim at its alternate size: the values repeat
    along it, so indices stay valid indices."""
    resized = []
    names = iter(inputs)
    for arg in args:
        if not isinstance(arg, Tensor):
            resized.append(arg)
            continue
        name = next(names)
        values = np.asarray(arg.to_numpy())
        for d in dynamic:
            if d.input == name:
                values = np.take(values, np.arange(d.alternate) % d.traced, axis=d.axis)
        resized.append(Tensor.from_data(values, arg.device, dtype=arg.dtype))
    return resized


def _other_values(args: tuple) -> list[Any]:
    """The example inputs with other values of the same kind: floats negated, scaled and
    shifted (a sign or threshold test turns), ints shuffled (so indices stay valid
    indices), bools negated."""
    rng = np.random.default_rng(0)
    changed = []
    for arg in args:
        if not isinstance(arg, Tensor):
            changed.append(arg)
            continue
        values = np.asarray(arg.to_numpy())
        if values.dtype == np.bool_:
            values = ~values
        elif np.issubdtype(values.dtype, np.integer):
            values = rng.permutation(values.reshape(-1)).reshape(values.shape)
        else:
            values = -1.5 * values - 0.25 + 0.1 * rng.standard_normal(values.shape)
        changed.append(Tensor.from_data(values, arg.device, dtype=arg.dtype))
    return changed


def _check_no_branch_on_data(main: Trace, other: Trace) -> None:
    """The forward read values computed from its inputs (in ``main.reads``): with other
    input values it must run the same ops, or it branches on data."""
    same = len(main.calls) == len(other.calls) and all(
        a.primitive == b.primitive and _same_attrs(a.attrs, b.attrs)
        for a, b in zip(main.calls, other.calls, strict=True))  # fmt: skip
    if not same:
        where = ", ".join(sorted({repr(p or "<root>") for p in main.reads}))
        raise ExportError(f"ONNX export: the forward branches on the values of its inputs "
                          f"(module {where} reads them, and other input values run other "
                          f"ops); a trace records one path, so it cannot be exported")


def _same_attrs(a: tuple, b: tuple) -> bool:
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # attributes holding arrays: compare by shape only
        return len(a) == len(b)


def _check_aligned(main: Trace, alternate: Trace) -> None:
    """Both traces ran the same ops on operands from the same places, or the forward
    depends on the sizes of its dynamic axes."""
    calls, others = main.calls, alternate.calls
    where_main, where_other = _origins(main), _origins(alternate)
    for a, b in zip(calls, others, strict=False):
        same = a.primitive == b.primitive and len(a.inputs) == len(b.inputs) and all(
            where_main(x) == where_other(y) for x, y in zip(a.inputs, b.inputs, strict=True))
        if not same:
            raise ExportError(
                f"ONNX export: the forward runs other ops when a dynamic axis changes size "
                f"(op {a.index}: {a.primitive} in module {a.module_path or '<root>'!r}, then "
                f"{b.primitive} in {b.module_path or '<root>'!r}); a trace records one path")
    if len(calls) != len(others):
        raise ExportError(f"ONNX export: the forward runs {len(calls)} ops at the traced "
                          f"sizes and {len(others)} at others; a trace records one path")


def _origins(traced: Trace):
    """Where an operand comes from: (call index, output), an input, a parameter, a constant."""
    places: dict[int, tuple] = {id(h): ("input", i) for i, h in enumerate(traced.inputs)}
    places.update({key: ("param", path) for key, (path, _h) in traced.params.items()})
    for call in traced.calls:
        places.update({id(h): ("call", call.index, j) for j, h in enumerate(call.outputs)})
    return lambda handle: None if handle is None else places.get(id(handle), ("constant",))


def _write(model: Any, path: Path) -> Path:
    if path.is_dir():
        raise ExportFileError(f"ONNX export: {path} is a directory; give a file path")
    try:
        atomic_write(path, model.SerializeToString())
    except OSError as error:
        raise ExportFileError(f"ONNX export: cannot write {path}: {error.strerror or error}"
                              ) from error  # fmt: skip
    return path
