"""An embedding whose table is quantized: what weight-only quantization makes of
:class:`ember.nn.Embedding`. A lookup dequantizes only the rows it reads.

Example:
    >>> import ember
    >>> from ember import Tensor, nn
    >>> from ember.quantization import QuantizedEmbedding, QuantScheme
    >>> table = nn.EmbeddingConfig(100, 16).init(ember.device("ndarray"))
    >>> q = QuantizedEmbedding.quantize(table, QuantScheme(granularity="axis", axis=0))
    >>> q(Tensor.from_data([[1, 5, 7]], kind=ember.Kind.INT)).shape
    (1, 3, 16)
"""

from __future__ import annotations

from ember.backend.errors import KindError, fmt_shape
from ember.module import Module, Param
from ember.quantization.linear import quantized_params
from ember.quantization.qtensor import QTensor
from ember.quantization.scheme import QuantScheme
from ember.tensor import Kind, Tensor

__all__ = ["QuantizedEmbedding"]


class QuantizedEmbedding(Module):
    """A table ``[n_embedding, d_model]`` of quantized rows, looked up by Int ids.

    Args:
        values: the quantized table's values (untrained).
        scales: the quantized table's scales.
        zero_points: the quantized table's zero points.
        scheme: its :class:`QuantScheme` (any granularity; per row, ``axis=0``, by default
            in :class:`~ember.quantization.QuantizeConfig`).
        shape: ``(n_embedding, d_model)``.

    Shape:
        ids ``[...]`` -> ``[..., d_model]``.
    """

    values: Param
    scales: Param
    zero_points: Param | None
    scheme: QuantScheme
    shape: tuple[int, int]

    @staticmethod
    def quantize(layer, scheme: QuantScheme) -> QuantizedEmbedding:
        """``layer`` (an :class:`ember.nn.Embedding`) with its table quantized by ``scheme``."""
        values, scales, zero_points = quantized_params(layer.weight, scheme)
        return QuantizedEmbedding(values, scales, zero_points, scheme, tuple(layer.weight.shape))

    @property
    def n_embedding(self) -> int:
        return self.shape[0]

    @property
    def d_model(self) -> int:
        return self.shape[1]

    def forward(self, ids: Tensor) -> Tensor:
        from ember.nn._util import check_indices

        if ids.kind is not Kind.INT:
            raise KindError(f"QuantizedEmbedding: expected Int ids, got a {ids.kind.value} tensor "
                            f"of shape {fmt_shape(ids.shape)}")  # fmt: skip
        check_indices("QuantizedEmbedding", "ids (n_embedding)", ids, self.n_embedding)
        flat = ids.reshape([-1])
        rows = self._rows(flat)
        return rows.dequantize().reshape([*ids.shape, self.d_model])

    def _rows(self, flat: Tensor) -> QTensor:
        """The quantized rows ``flat`` of the table, with the parameters they use."""
        n, d = self.shape
        scheme = self.scheme
        values = self.values.val()
        if scheme.value == "int4":
            if d % 2:  # rows do not start on a byte: unpack the table
                values = QTensor(values, self.scales.val(), None, scheme, self.shape).int_values()
                scheme = scheme.with_value("int8")
            else:  # a row is d / 2 whole bytes
                values = values.reshape([n, d // 2])
        values = values.select(0, flat).reshape([-1])
        if scheme.value == "int8":
            values = values.reshape([flat.shape[0], d])
        axis = scheme.resolved_axis(2)
        scales = self.scales.val()
        zero_points = None if self.zero_points is None else self.zero_points.val()
        if axis == 0:
            # Per row: the rows' own parameters. Blocks of rows: each row's block's, which
            # makes one parameter per element of the rows (blocks of 1 along a row).
            by = flat if scheme.granularity == "axis" else flat.div_scalar(scheme.block_size)
            scales = scales.select(0, by)
            zero_points = None if zero_points is None else zero_points.select(0, by)
            if scheme.granularity == "block":
                scheme = scheme.with_axis(1).with_block_size(1)
        elif scheme.granularity == "block":  # blocks along a row: the rows' blocks
            scales = scales.select(0, flat)
            zero_points = None if zero_points is None else zero_points.select(0, flat)
        return QTensor(values, scales, zero_points, scheme, (flat.shape[0], d))
