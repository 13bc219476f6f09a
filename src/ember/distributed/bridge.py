"""Carrying ember tensors into ``torch.distributed`` and back.

Collectives work in place on torch tensors. :func:`to_engine` makes the one copy a
collective needs (ember tensors never change, so the engine may not write into the caller's
buffer): a CUDA tensor of the Torch backend is cloned on its own device (so NCCL gets CUDA
memory); any other tensor's elements are copied once into a CPU buffer that torch and
NumPy share, reused from a pool once nothing refers to it (``buffers.py``). :func:`from_engine` hands that buffer back without a copy: NdArray wraps the
NumPy view of it, Torch wraps the tensor itself. Autodiff tensors travel as their values
(the result is untracked, as a collective has no gradient rule); a fusion tensor is
computed first (reading its data runs its stream).
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import ml_dtypes
import numpy as np

from ember.backend.device import Device, device
from ember.backend.errors import DTypeError
from ember.distributed.buffers import POOL
from ember.tensor import DType, Tensor
from ember.tensor.tensor import _wrap

# The dtypes each engine reduces, broadcasts and gathers (measured on gloo: int16 and the
# unsigned types above 8 bits are "Invalid scalar type"; NCCL has no bool).
ENGINE_DTYPES: dict[str, frozenset[DType]] = {
    "gloo": frozenset({DType.F64, DType.F32, DType.F16, DType.BF16, DType.I64, DType.I32,
                       DType.I8, DType.U8, DType.BOOL}),
    "nccl": frozenset({DType.F64, DType.F32, DType.F16, DType.BF16, DType.I64, DType.I32,
                       DType.I8, DType.U8}),
}


def check_dtype(owner: str, tensor: Tensor, engine: str) -> None:
    """:class:`DTypeError` unless ``engine`` carries ``tensor``'s dtype."""
    carried = ENGINE_DTYPES[engine]
    if tensor.dtype not in carried:
        names = ", ".join(sorted(d.value for d in carried))
        raise DTypeError(
            f"{owner}: {engine} cannot carry {tensor.dtype.value} tensors; it carries {names} "
            "(cast the tensor first)"
        )


def _is_torch(dev: Device) -> bool:
    return dev.backend.name == "torch"


def _plain(tensor: Tensor) -> Tensor:
    return tensor.inner() if hasattr(tensor.device.backend, "backward") else tensor


# gloo keeps the tensor of a rank's last collective alive until its next one. A torch view
# of a NumPy array holds that array, so the buffer of a result just donated would count one
# reference too many: (the id of the last donated array, a weak reference to its view).
_last_donation: tuple[int, Any] = (0, lambda: None)


def donated(tensor: Tensor) -> Any:
    """``tensor``'s own buffer as a torch tensor, when the caller gave ``tensor`` up and
    nothing else can see that buffer; None otherwise (then :func:`to_engine` copies).

    Only a plain NdArray or Torch tensor qualifies, whose primitive is a writable,
    contiguous array that owns its memory and that nothing but the tensor refers to: no
    other tensor, and no view (a NumPy or torch view holds a reference to its base)."""
    import torch

    global _last_donation
    if type(tensor) is not Tensor:
        return None
    prim = tensor._prim
    # A live view keeps its array alive, so the id cannot have been reused.
    engine_view = _last_donation[1]() if _last_donation[0] == id(prim) else None
    # References: the tensor's slot, this frame's local and getrefcount's argument, and the
    # engine's view from the last donation while the engine still holds it.
    if sys.getrefcount(prim) > 3 + (engine_view is not None):
        return None
    if type(prim) is np.ndarray and tensor.device.backend.name == "ndarray":
        usable = prim.base is None and prim.flags.writeable and prim.flags.c_contiguous
        if not usable or prim.dtype == ml_dtypes.bfloat16:
            return None
        view = engine_view if engine_view is not None else torch.from_numpy(prim)
        _last_donation = (id(prim), weakref.ref(view))
        return view
    if isinstance(prim, torch.Tensor) and _is_torch(tensor.device):
        usable = prim._base is None and prim.is_contiguous() and not prim.requires_grad
        # An alias of the storage: what the engine keeps never counts as a reference to prim.
        return prim.detach() if usable else None
    return None


def to_engine(tensor: Tensor) -> Any:
    """A contiguous torch tensor holding a copy of ``tensor``'s elements (the engine's own)."""
    import torch

    plain = _plain(tensor)
    if _is_torch(plain.device) and plain._prim.device.type != "cpu":
        return plain._prim.detach().clone(memory_format=torch.contiguous_format)
    source = plain.into_data().to_numpy()  # NdArray's own buffer; a view of a CPU torch tensor
    target = POOL.take(source.nbytes)[: source.nbytes].view(source.dtype).reshape(source.shape)
    np.copyto(target, source)
    if source.dtype == ml_dtypes.bfloat16:  # NumPy's bfloat16 crosses as its bits
        return torch.from_numpy(target.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(target)


def engine_device(tensor: Tensor) -> Any:
    """The torch device a collective on ``tensor`` runs on (CUDA for a CUDA Torch tensor)."""
    plain = _plain(tensor)
    if _is_torch(plain.device):
        return plain._prim.device
    import torch

    return torch.device("cpu")


def from_engine(buffer: Any, like: Tensor) -> Tensor:
    """``buffer`` (a torch tensor the engine filled) as a tensor on ``like``'s device."""
    dev = like.device
    autodiff = hasattr(dev.backend, "backward")
    inner = dev.inner() if autodiff else dev
    if _is_torch(inner):
        result = _wrap(buffer, inner, like.kind)
    else:
        data = _wrap(buffer, device("torch"), like.kind).into_data()  # a view, not a copy
        result = Tensor.from_data(data, inner, like.dtype)
    return Tensor.from_inner(result, dev) if autodiff else result
