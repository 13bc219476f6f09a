"""Embedding: a learned lookup table from token ids to vectors."""

from __future__ import annotations

from ember.backend.device import Device
from ember.backend.errors import KindError, fmt_shape
from ember.config import Config
from ember.config.fields import PositiveInt
from ember.module import Module, Param
from ember.nn._util import check_indices
from ember.nn.initializer import Initializer, Normal
from ember.tensor import Kind, Tensor
from ember.tensor import module as F


class EmbeddingConfig(Config):
    """Configuration of an :class:`Embedding` layer.

    Args:
        n_embedding: the number of rows: ids run from 0 to ``n_embedding - 1``.
        d_model: the size of each vector.
        initializer: how to fill the table, with ``fan_in = d_model`` and
            ``fan_out = n_embedding`` (PyTorch's fans of this shape).
            Default: ``Normal(0, 1)``, as Burn and PyTorch.

    Example:
        >>> import ember
        >>> from ember.nn.embedding import EmbeddingConfig
        >>> EmbeddingConfig(100, 16).init(ember.device("ndarray")).weight.shape
        (100, 16)
    """

    n_embedding: PositiveInt
    d_model: PositiveInt
    initializer: Initializer = Normal(mean=0.0, std=1.0)

    def init(self, device: Device | None = None) -> Embedding:
        """A new :class:`Embedding` with a freshly initialized table on ``device``."""
        shape = [self.n_embedding, self.d_model]
        # PyTorch's fans for a [rows, columns] weight, for the scaled initializers.
        fans = {"fan_in": self.d_model, "fan_out": self.n_embedding}
        return Embedding(self.initializer.init_param(shape, device, **fans))


class Embedding(Module):
    """Looks up one row of a learned table per id: ``y[b, s] = weight[ids[b, s]]``.

    The gradient of the table adds up the gradients of every position that used a
    row. The table is ``[n_embedding, d_model]``, as in PyTorch's ``nn.Embedding``,
    so PyTorch weights load as they are.

    Args:
        weight: the table, ``[n_embedding, d_model]``.

    Shape:
        - Input: Int ids ``[batch, seq_length]`` (Burn's shape; any shape works), each in
          ``[0, n_embedding)``.
        - Output: ``[batch, seq_length, d_model]`` (the ids' shape plus ``d_model``).

    Raises:
        KindError: for ids that are not an Int tensor.
        EmberIndexError: for an id outside ``[0, n_embedding)``. Checking reads the ids'
            smallest and largest values back from the device.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.embedding import EmbeddingConfig
        >>> from ember.nn.initializer import Constant
        >>> table = EmbeddingConfig(10, 3, initializer=Constant(0.5)).init()
        >>> ids = Tensor.from_data([[1, 4, 4], [0, 9, 2]])
        >>> y = table(ids)
        >>> y.shape, y[0, 1].tolist()
        ((2, 3, 3), [0.5, 0.5, 0.5])
    """

    weight: Param

    @property
    def n_embedding(self) -> int:
        return self.weight.shape[0]

    @property
    def d_model(self) -> int:
        return self.weight.shape[1]

    def forward(self, ids: Tensor) -> Tensor:
        if ids.kind is not Kind.INT:
            raise KindError(
                f"Embedding: expected Int ids of shape [batch, seq_length], got a "
                f"{ids.kind.value} tensor of shape {fmt_shape(ids.shape)}"
            )
        check_indices("Embedding", "ids (n_embedding)", ids, self.n_embedding)
        return F.embedding(self.weight.val(), ids)
