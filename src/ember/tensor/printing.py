"""How a tensor prints: its data (summarized when large), shape, device, backend, kind, dtype."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.backend.environment import whole_number

if TYPE_CHECKING:
    from ember.tensor.tensor import Tensor


def _threshold() -> int:
    # EMBER_PRINT_THRESHOLD=n shows up to n elements in full before summarizing.
    return whole_number("EMBER_PRINT_THRESHOLD", 1000, "elements", "0 summarizes every tensor")


def format_tensor(tensor: Tensor) -> str:
    """The multi-line description ``print(tensor)`` shows.

    Example:
        >>> from ember import Tensor
        >>> print(Tensor.from_data([[1.0, 2.0]]))  # doctest: +NORMALIZE_WHITESPACE
        Tensor {
          data:
        [[1.0, 2.0]],
          shape:  [1, 2],
          device:  ndarray:cpu:0,
          backend:  "ndarray",
          kind:  "Float",
          dtype:  "f32",
        }
    """
    data = tensor.into_data()
    shape = ", ".join(str(d) for d in data.shape)
    return (
        "Tensor {\n"
        f"  data:\n{data.format(threshold=_threshold())},\n"
        f"  shape:  [{shape}],\n"
        f"  device:  {tensor.device},\n"
        f'  backend:  "{tensor.backend.name}",\n'
        f'  kind:  "{tensor.kind.value}",\n'
        f'  dtype:  "{data.dtype}",\n'
        "}"
    )
