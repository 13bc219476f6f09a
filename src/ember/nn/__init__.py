"""Neural network layers, losses and their building blocks, each built from a config.

A layer is a :class:`~ember.module.Module` whose parameters are
:class:`~ember.module.Param`; its config is a frozen :class:`~ember.Config` that saves
to JSON, with Burn's defaults (each layer's docstring says where PyTorch's differ), and
``config.init(device)`` builds it. Layers train on an autodiff device (dropout drops,
batch norm uses the batch's statistics) and infer elsewhere, e.g. after ``valid()``.
Layers whose PyTorch counterparts store weights in another layout register a rule with
the PyTorch adapter (``ember.record.adapter.PYTORCH``), so PyTorch state dicts load
directly.

=============  ==================================================================
family         layers
=============  ==================================================================
linear         Linear, Embedding, SwiGlu, PositionWiseFeedForward
convolution    Conv1d/2d/3d, ConvTranspose1d/2d/3d (Valid / Same / Explicit padding)
pooling        AvgPool1d/2d, MaxPool1d/2d, AdaptiveAvgPool1d/2d
normalization  BatchNorm, LayerNorm, GroupNorm, InstanceNorm, RmsNorm
recurrent      Lstm, BiLstm, Gru
attention      MultiHeadAttention, TransformerEncoder, TransformerDecoder,
               PositionalEncoding, RotaryEncoding
other          Dropout, Interpolate1d/2d, PRelu, an activation module per function
losses         CrossEntropyLoss, BinaryCrossEntropyLoss, MseLoss, HuberLoss,
               SmoothL1Loss, KLDivLoss, CosineEmbeddingLoss
=============  ==================================================================

Example:
    >>> import ember
    >>> from ember import Tensor, nn
    >>> device = ember.device("ndarray")
    >>> conv = nn.Conv2dConfig([1, 8], [3, 3]).init(device)
    >>> head = nn.LinearConfig(8, 10).init(device)
    >>> x = conv(Tensor.ones([2, 1, 5, 5], device))
    >>> logits = head(x.mean_dim(3).mean_dim(2).flatten(1))
    >>> logits.shape
    (2, 10)
    >>> loss = nn.CrossEntropyLossConfig().init(device)(logits, Tensor.from_data([1, 7], device))
    >>> loss.shape
    ()
"""

from ember.nn._util import is_training
from ember.nn.activation import (
    Celu,
    CeluConfig,
    Elu,
    EluConfig,
    Gelu,
    GeluConfig,
    Glu,
    GluConfig,
    HardSigmoid,
    HardSigmoidConfig,
    HardSwish,
    LeakyRelu,
    LeakyReluConfig,
    LogSigmoid,
    LogSoftmax,
    LogSoftmaxConfig,
    Mish,
    PRelu,
    PReluConfig,
    QuietSoftmax,
    QuietSoftmaxConfig,
    Relu,
    Relu6,
    Selu,
    Sigmoid,
    Silu,
    Softmax,
    SoftmaxConfig,
    Softmin,
    SoftminConfig,
    Softplus,
    SoftplusConfig,
    Swish,
    Tanh,
)
from ember.nn.attention import (
    MhaCache,
    MhaInput,
    MhaOutput,
    MultiHeadAttention,
    MultiHeadAttentionConfig,
    PaddingMask,
    generate_autoregressive_mask,
    generate_padding_mask,
)
from ember.nn.conv import (
    Conv1d,
    Conv1dConfig,
    Conv2d,
    Conv2dConfig,
    Conv3d,
    Conv3dConfig,
    PaddingConfig,
    PaddingConfig1d,
    PaddingConfig2d,
    PaddingConfig3d,
)
from ember.nn.conv_transpose import (
    ConvTranspose1d,
    ConvTranspose1dConfig,
    ConvTranspose2d,
    ConvTranspose2dConfig,
    ConvTranspose3d,
    ConvTranspose3dConfig,
)
from ember.nn.dropout import (
    Dropout,
    DropoutConfig,
)
from ember.nn.embedding import (
    Embedding,
    EmbeddingConfig,
)
from ember.nn.initializer import (
    Initializer,
)
from ember.nn.interpolate import (
    Interpolate1d,
    Interpolate1dConfig,
    Interpolate2d,
    Interpolate2dConfig,
    InterpolateMode,
)
from ember.nn.linear import (
    Linear,
    LinearConfig,
    transposed,
)
from ember.nn.loss import (
    BinaryCrossEntropyLoss,
    BinaryCrossEntropyLossConfig,
    CosineEmbeddingLoss,
    CosineEmbeddingLossConfig,
    CrossEntropyLoss,
    CrossEntropyLossConfig,
    HuberLoss,
    HuberLossConfig,
    KLDivLoss,
    KLDivLossConfig,
    MseLoss,
    MseLossConfig,
    SmoothL1Loss,
    SmoothL1LossConfig,
)
from ember.nn.norm import (
    BatchNorm,
    BatchNormConfig,
    GroupNorm,
    GroupNormConfig,
    InstanceNorm,
    InstanceNormConfig,
    LayerNorm,
    LayerNormConfig,
    RmsNorm,
    RmsNormConfig,
)
from ember.nn.pool import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool1dConfig,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool2dConfig,
    AvgPool1d,
    AvgPool1dConfig,
    AvgPool2d,
    AvgPool2dConfig,
    MaxPool1d,
    MaxPool1dConfig,
    MaxPool2d,
    MaxPool2dConfig,
)
from ember.nn.pos_encoding import (
    PositionalEncoding,
    PositionalEncodingConfig,
    RotaryEncoding,
    RotaryEncodingConfig,
)
from ember.nn.rnn import (
    BiLstm,
    BiLstmConfig,
    Gru,
    GruConfig,
    Lstm,
    LstmConfig,
    LstmState,
)
from ember.nn.swiglu import (
    SwiGlu,
    SwiGluConfig,
)
from ember.nn.transformer import (
    PositionWiseFeedForward,
    PositionWiseFeedForwardConfig,
    TransformerDecoder,
    TransformerDecoderAutoregressiveCache,
    TransformerDecoderConfig,
    TransformerDecoderInput,
    TransformerDecoderLayer,
    TransformerDecoderLayerAutoregressiveCache,
    TransformerEncoder,
    TransformerEncoderAutoregressiveCache,
    TransformerEncoderConfig,
    TransformerEncoderInput,
    TransformerEncoderLayer,
)

__all__ = [
    "AdaptiveAvgPool1d", "AdaptiveAvgPool1dConfig", "AdaptiveAvgPool2d",
    "AdaptiveAvgPool2dConfig", "AvgPool1d", "AvgPool1dConfig", "AvgPool2d", "AvgPool2dConfig",
    "BatchNorm", "BatchNormConfig", "BiLstm", "BiLstmConfig", "BinaryCrossEntropyLoss",
    "BinaryCrossEntropyLossConfig", "Celu", "CeluConfig", "Conv1d", "Conv1dConfig", "Conv2d",
    "Conv2dConfig", "Conv3d", "Conv3dConfig", "ConvTranspose1d", "ConvTranspose1dConfig",
    "ConvTranspose2d", "ConvTranspose2dConfig", "ConvTranspose3d", "ConvTranspose3dConfig",
    "CosineEmbeddingLoss", "CosineEmbeddingLossConfig", "CrossEntropyLoss",
    "CrossEntropyLossConfig", "Dropout", "DropoutConfig", "Elu", "EluConfig", "Embedding",
    "EmbeddingConfig", "Gelu", "GeluConfig", "Glu", "GluConfig", "GroupNorm",
    "GroupNormConfig", "Gru", "GruConfig", "HardSigmoid", "HardSigmoidConfig", "HardSwish",
    "HuberLoss", "HuberLossConfig", "Initializer", "InstanceNorm", "InstanceNormConfig",
    "Interpolate1d", "Interpolate1dConfig", "Interpolate2d", "Interpolate2dConfig",
    "InterpolateMode", "KLDivLoss", "KLDivLossConfig", "LayerNorm", "LayerNormConfig",
    "LeakyRelu", "LeakyReluConfig", "Linear", "LinearConfig", "LogSigmoid", "LogSoftmax",
    "LogSoftmaxConfig", "Lstm", "LstmConfig", "LstmState", "MaxPool1d", "MaxPool1dConfig",
    "MaxPool2d", "MaxPool2dConfig", "MhaCache", "MhaInput", "MhaOutput", "Mish", "MseLoss",
    "MseLossConfig", "MultiHeadAttention", "MultiHeadAttentionConfig", "PRelu", "PReluConfig",
    "PaddingConfig", "PaddingConfig1d", "PaddingConfig2d", "PaddingConfig3d", "PaddingMask",
    "PositionWiseFeedForward", "PositionWiseFeedForwardConfig", "PositionalEncoding",
    "PositionalEncodingConfig", "QuietSoftmax", "QuietSoftmaxConfig", "Relu", "Relu6",
    "RmsNorm", "RmsNormConfig", "RotaryEncoding", "RotaryEncodingConfig", "Selu", "Sigmoid",
    "Silu", "SmoothL1Loss", "SmoothL1LossConfig", "Softmax", "SoftmaxConfig", "Softmin",
    "SoftminConfig", "Softplus", "SoftplusConfig", "SwiGlu", "SwiGluConfig", "Swish", "Tanh",
    "TransformerDecoder", "TransformerDecoderAutoregressiveCache", "TransformerDecoderConfig",
    "TransformerDecoderInput", "TransformerDecoderLayer",
    "TransformerDecoderLayerAutoregressiveCache", "TransformerEncoder",
    "TransformerEncoderAutoregressiveCache", "TransformerEncoderConfig",
    "TransformerEncoderInput", "TransformerEncoderLayer", "generate_autoregressive_mask",
    "generate_padding_mask", "is_training", "transposed",
]  # fmt: skip
