"""Function transforms: gradients, vector-Jacobian and Jacobian-vector products, Hessians.

In the spirit of ``torch.func`` and JAX, over ember's Autodiff decorator. Every transform
takes a function of tensors on an autodiff device and returns a function; the tensors it
returns are differentiable again (they come from ``backward(create_graph=True)``), so the
transforms nest: ``grad(grad(f))``, ``jacobian(grad(f))`` (that is :func:`hessian`).

* :func:`grad`, :func:`value_and_grad`: the gradient of a scalar function with respect to
  the arguments ``argnums`` names.
* :func:`vjp`: the function's value and its vector-Jacobian product (reverse mode).
* :func:`jvp`: the Jacobian-vector product (forward mode), computed by transposing a vjp:
  ``u -> J^T u`` is linear in ``u``, so the gradient of ``<J^T u, v>`` with respect to
  ``u`` is ``J v`` (two reverse passes, no forward rules).
* :func:`hvp`: the Hessian-vector product, the gradient of ``<grad f, v>``.
* :func:`jacobian`, :func:`hessian`: whole matrices, one reverse pass per output element
  (for small functions).
* :func:`functional_call`: a module run with some of its parameters replaced by given
  tensors, so that a MAML-style inner step needs no mutation.

An argument that is already tracked (a leaf, or a tensor of an enclosing transform's graph)
is differentiated where it is, so that an outer transform sees through an inner one; an
untracked argument becomes a new leaf.

Example:
    >>> import ember
    >>> from ember import Tensor
    >>> from ember.func import grad, hessian
    >>> x = Tensor.from_data([1.0, 2.0], ember.device("ndarray").autodiff())
    >>> f = lambda x: (x * x * x).sum()
    >>> grad(f)(x).tolist()                                       # 3 x^2
    [3.0, 12.0]
    >>> grad(grad(f))(Tensor.from_data([2.0], x.device)).tolist()   # 6 x
    [12.0]
    >>> hessian(f)(x).tolist()                                    # diag(6 x)
    [[6.0, 0.0], [0.0, 12.0]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ember.backend.errors import ArgumentError, KindError, ShapeError, UnsupportedError, fmt_shape
from ember.tensor import Kind, Tensor

__all__ = ["functional_call", "grad", "hessian", "hvp", "jacobian", "jvp", "value_and_grad", "vjp"]

Argnums = int | Sequence[int]


def grad(f: Callable[..., Tensor], argnums: Argnums = 0) -> Callable[..., Any]:
    """The gradient of the scalar function ``f`` with respect to its arguments ``argnums``
    (one tensor for an int, a tuple for a sequence).

    Raises (when called):
        ShapeError: ``f`` returns more than one element.
        ArgumentError: ``argnums`` out of range of the arguments.
        KindError / UnsupportedError: an argument is not a Float tensor on an autodiff device.
    """

    def gradient(*args: Any) -> Any:
        return value_and_grad(f, argnums)(*args)[1]

    return gradient


def value_and_grad(f: Callable[..., Tensor], argnums: Argnums = 0) -> Callable[..., Any]:
    """``f``'s value and its gradient (as :func:`grad`), from one forward pass."""

    def run(*args: Any) -> tuple[Tensor, Any]:
        args, wanted = _leaves("grad", args, argnums)
        value = f(*args)
        _check_scalar("grad", value)
        grads = value.backward(create_graph=True, inputs=[args[i] for i in wanted])
        found = tuple(_grad_or_zeros(args[i], grads) for i in wanted)
        return value, found[0] if isinstance(argnums, int) else found

    return run


def vjp(f: Callable[..., Tensor], *primals: Tensor) -> tuple[Tensor, Callable[[Tensor], tuple]]:
    """``f(*primals)`` and the function ``cotangent -> (J_i^T cotangent for each primal)``.

    Raises:
        ShapeError: a cotangent of another shape than ``f``'s value.
    """
    args, wanted = _leaves("vjp", primals, tuple(range(len(primals))))
    value = f(*args)
    _check_float("vjp", value, "the function's value")

    def pullback(cotangent: Tensor) -> tuple[Tensor, ...]:
        if tuple(cotangent.shape) != tuple(value.shape):
            raise ShapeError(f"vjp: the cotangent has shape {fmt_shape(cotangent.shape)}, the "
                             f"function's value {fmt_shape(value.shape)}")  # fmt: skip
        grads = (value * cotangent).sum().backward(create_graph=True, inputs=list(args))
        return tuple(_grad_or_zeros(args[i], grads) for i in wanted)

    return value, pullback


def jvp(f: Callable[..., Tensor], primals: Sequence[Tensor],
        tangents: Sequence[Tensor]) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``f(*primals)`` and ``sum_i J_i tangents[i]`` (forward mode, by transposing a vjp:
    see the module doc).

    Raises:
        ArgumentError: not as many tangents as primals.
        ShapeError: a tangent of another shape than its primal.
    """
    if len(primals) != len(tangents):
        raise ArgumentError(f"jvp: {len(primals)} primals but {len(tangents)} tangents")
    for i, (p, t) in enumerate(zip(primals, tangents)):
        if tuple(p.shape) != tuple(t.shape):
            raise ShapeError(f"jvp: tangent {i} has shape {fmt_shape(t.shape)}, its primal "
                             f"{fmt_shape(p.shape)}")  # fmt: skip
    value, pullback = vjp(f, *primals)
    dummy = Tensor.zeros(list(value.shape), value.device, value.dtype).require_grad()
    total = _dot(pullback(dummy), tangents)  # <J^T u, v>, linear in u
    if not total.is_require_grad():  # f is constant in every primal: J v = 0
        return value, Tensor.zeros(list(value.shape), value.device, value.dtype)
    grads = total.backward(create_graph=True)
    return value, _grad_or_zeros(dummy, grads)


def hvp(f: Callable[..., Tensor], primals: Sequence[Tensor],
        tangents: Sequence[Tensor]) -> tuple[Tensor, ...]:  # fmt: skip
    """The Hessian of the scalar ``f`` at ``primals`` times ``tangents``: the gradient of
    ``sum_i <grad_i f, tangents[i]>`` (reverse over reverse)."""
    if len(primals) != len(tangents):
        raise ArgumentError(f"hvp: {len(primals)} primals but {len(tangents)} tangents")
    argnums = tuple(range(len(primals)))

    def directional(*args: Tensor) -> Tensor:
        return _dot(grad(f, argnums)(*args), tangents)

    return grad(directional, argnums)(*primals)


def jacobian(f: Callable[..., Tensor], argnum: int = 0) -> Callable[..., Tensor]:
    """The Jacobian of ``f`` with respect to argument ``argnum``: a tensor of shape
    ``f``'s value's shape + the argument's shape, one reverse pass per value element (for
    small functions)."""

    def run(*args: Any) -> Tensor:
        args, (index,) = _leaves("jacobian", args, (argnum,))
        x = args[index]
        value = f(*args)
        _check_float("jacobian", value, "the function's value")
        flat = value.reshape([-1])
        rows = []
        for i in range(flat.shape[0]):
            grads = flat[i : i + 1].sum().backward(create_graph=True, inputs=[x])
            rows.append(_grad_or_zeros(x, grads).reshape([1, -1]))
        stacked = Tensor.cat(rows, 0) if rows else Tensor.zeros([0, x.numel()], x.device, x.dtype)
        return stacked.reshape([*value.shape, *x.shape])

    return run


def hessian(f: Callable[..., Tensor], argnum: int = 0) -> Callable[..., Tensor]:
    """The Hessian of the scalar ``f`` with respect to argument ``argnum``:
    ``jacobian(grad(f))``, of shape the argument's shape twice."""
    return jacobian(grad(f, argnum), argnum)


def functional_call(module: Any, params: dict[str, Tensor], *args: Any, **kwargs: Any) -> Any:
    """``module(*args, **kwargs)`` with the parameters at the paths of ``params``
    (``"linear.weight"``, as ``module.params()`` names them) replaced by the given tensors;
    the module itself is unchanged.

    Raises:
        ArgumentError: a path names no parameter of the module.
        ShapeError: a tensor of another shape than the parameter it replaces.
    """
    known = dict(module.params())
    unknown = [path for path in params if path not in known]
    if unknown:
        raise ArgumentError(f"functional_call: no parameter at {', '.join(map(repr, unknown))} "
                            f"(the module has {', '.join(known) or 'none'})")  # fmt: skip
    for path, tensor in params.items():
        if tuple(tensor.shape) != tuple(known[path].shape):
            raise ShapeError(f"functional_call: {path!r} has shape {fmt_shape(known[path].shape)}, "
                             f"the tensor given for it {fmt_shape(tensor.shape)}")  # fmt: skip

    def replace(path: str, param: Any) -> Any:
        return param.with_value(params[path]) if path in params else param

    return module.map(replace)(*args, **kwargs)


# ------------------------------------------------------------------------------ helpers


def _leaves(what: str, args: Sequence[Any], argnums: Argnums) -> tuple[list, tuple[int, ...]]:
    """The arguments with those of ``argnums`` tracked (a new leaf where untracked), and the
    indices of those."""
    wanted = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not wanted:
        raise ArgumentError(f"{what}: argnums is empty")
    args = list(args)
    for i in wanted:
        if isinstance(i, bool) or not isinstance(i, int) or not -len(args) <= i < len(args):
            raise ArgumentError(f"{what}: argnums {i!r} is out of range for {len(args)} "
                                f"argument(s)")  # fmt: skip
    wanted = tuple(i % len(args) for i in wanted)
    for i in wanted:
        x = args[i]
        _check_float(what, x, f"argument {i}")
        if not hasattr(x.device.backend, "backward"):
            raise UnsupportedError(f"{what}: argument {i} is on {x.device}, which has no "
                                   "autodiff: use a device from device.autodiff()")  # fmt: skip
        if not x.is_require_grad():
            args[i] = x.require_grad()
    return args, wanted


def _check_float(what: str, x: Any, name: str) -> None:
    if not isinstance(x, Tensor) or x.kind is not Kind.FLOAT:
        kind = x.kind.value if isinstance(x, Tensor) else type(x).__name__
        raise KindError(f"{what}: {name} must be a Float tensor, got {kind}")


def _check_scalar(what: str, value: Any) -> None:
    _check_float(what, value, "the function's value")
    if value.numel() != 1:
        raise ShapeError(f"{what}: the function must return a scalar (one element), got shape "
                         f"{fmt_shape(value.shape)}")  # fmt: skip


def _dot(xs: Sequence[Tensor], ys: Sequence[Tensor]) -> Tensor:
    """``sum_i <xs[i], ys[i]>``, one scalar."""
    total = None
    for x, y in zip(xs, ys):
        term = (x * y).sum()
        total = term if total is None else total + term
    return total


def _grad_or_zeros(x: Tensor, grads: Any) -> Tensor:
    """``x``'s gradient in ``grads`` (on ``x``'s device), zeros where ``f`` does not depend
    on it."""
    found = x.grad(grads)
    if found is None:
        return Tensor.zeros(list(x.shape), x.device, x.dtype)
    return found
