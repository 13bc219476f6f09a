"""User-defined ops: a new entry in the op table at run time.

A custom op is declared like the built-in ones: its tensor inputs, its
attributes, an abstract-evaluation rule and a reference implementation written
with the protocol's primitives (so it runs, and differentiates, on every
backend). A backend may get a faster kernel; a backward rule (registered with
``ember.backends.autodiff.backward``) makes the Autodiff decorator run the op
as one inner call instead of differentiating through the reference.

Example (the full version, with kernels and a backward rule, is
``examples/custom_op.py``):

    >>> from ember import Tensor
    >>> from ember.backend import AVal, custom_op
    >>> def twice_rule(op, x):
    ...     return AVal(x.shape, x.dtype)
    >>> twice = custom_op("twice", ("tensor",), twice_rule,
    ...                   reference=lambda B, x: B.float_mul_scalar(x, 2.0))
    >>> twice(Tensor.from_data([1.0, 2.0])).tolist()
    [2.0, 4.0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ember.backend.base import Backend
from ember.backend.decorator import Decorator
from ember.backend.errors import ArgumentError, KindError
from ember.backend.ops import FLOAT, OPS, OpDef

if TYPE_CHECKING:
    from ember.tensor.tensor import Tensor


class CustomOp:
    """A registered custom op; call it with tensors (and attributes) like a function."""

    def __init__(self, op: OpDef, reference: Callable) -> None:
        self.op = op
        self.reference = reference

    @property
    def name(self) -> str:
        return self.op.name

    def kernel(self, backend_class: type[Backend]) -> Callable[[Callable], Callable]:
        """Decorator giving ``backend_class`` its own implementation ``fn(backend, *args)``."""
        if issubclass(backend_class, Decorator):
            raise ArgumentError(f"{self.name}: kernels belong to base backends, not to the decorator {backend_class.__name__}")

        def install(fn: Callable) -> Callable:
            setattr(backend_class, self.name, fn)
            return fn

        return install

    def __call__(self, *args: Any) -> Tensor:
        from ember.tensor.tensor import Tensor, _same_device, _wrap

        n = len(self.op.inputs)
        if len(args) != n + len(self.op.attrs):
            raise ArgumentError(
                f"{self.name}: expected {n} tensors and {len(self.op.attrs)} attributes, got {len(args)} arguments"
            )
        tensors, attrs = args[:n], args[n:]
        for t in tensors:
            if not isinstance(t, Tensor):
                raise ArgumentError(f"{self.name}: expected a tensor, got {type(t).__name__}")
            if t.kind not in self.op.kinds:
                raise KindError(f"{self.name}: needs Float tensors, got a {t.kind.value} tensor")
            _same_device(self.name, tensors[0], t)
        out = self.op.rule(self.name, *[t._aval() for t in tensors], *attrs)
        first = tensors[0]
        prim = getattr(first.backend, self.name)(*[t._prim for t in tensors], *attrs)
        return _wrap(prim, first.device, out.dtype.kind)

    def __repr__(self) -> str:
        return f"CustomOp({self.name})"


def custom_op(name: str, inputs: Sequence[str], rule: Callable, reference: Callable,
              attrs: Sequence[str] = ()) -> CustomOp:  # fmt: skip
    """Adds a Float op to the op table and to every backend.

    Args:
        name: the op's name (and backend method name); must be new.
        inputs: names of its tensor operands, in call order.
        rule: ``rule(name, *avals, *attrs) -> AVal``: checks the input and gives the output
            shape and dtype (see ``ember.backend.rules``).
        reference: ``reference(B, *primitives, *attrs)``: the op from backend ``B``'s
            primitives. It is every backend's implementation until one gets a kernel.
        attrs: names of its non-tensor arguments, after the tensors.
    """
    if name in OPS:
        raise ArgumentError(f"custom_op: an op named {name!r} already exists")
    op = OpDef(name, FLOAT, tuple(inputs), tuple(attrs), rule, "custom", composite=True, prefixed=False)
    OPS[name] = op

    def default(self, *args):
        return reference(self, *args)

    def through_decorator(self, *args):
        # Decided per call: a backward rule registered after custom_op() still takes effect.
        if type(self).forward_composite(op):
            return self.call(op, name, args)
        return reference(self, *args)

    # Every backend inherits these; a kernel set on a backend class overrides the reference.
    setattr(Backend, name, default)
    setattr(Decorator, name, through_decorator)
    return CustomOp(op, reference)
