"""Recurrent layers: Lstm, BiLstm and Gru, with their gates fused.

Every recurrent layer here keeps two :class:`~ember.nn.linear.Linear` maps whose
outputs hold all of its gates side by side, in blocks of ``d_hidden`` columns:

* ``input_transform``: ``[d_input, G * d_hidden]``, applied to the inputs;
* ``hidden_transform``: ``[d_hidden, G * d_hidden]``, applied to the hidden state.

=======  ==  ====================================================================
layer    G   column blocks, in order
=======  ==  ====================================================================
Lstm     4   input gate ``i``, forget gate ``f``, cell candidate ``g``, output gate ``o``
Gru      3   reset gate ``r``, update gate ``z``, new candidate ``n``
=======  ==  ====================================================================

This is PyTorch's gate order, so ``weight_ih_l0`` of ``torch.nn.LSTM`` / ``GRU`` is
``input_transform.weight`` transposed (the PyTorch adapter does that on import).
Burn keeps one small ``GateController`` (two linear maps) per gate; fusing them
lets the whole input sequence be projected for every gate with a single matrix
product before the time loop, and each step do a single product with the hidden
state.

The time loop itself is one op, :func:`~ember.nn.rnn_sequence.lstm_sequence` or
:func:`~ember.nn.rnn_sequence.gru_sequence` (forward and backward over the whole sequence,
both directions of a :class:`BiLstm` at once): NdArray runs it as one NumPy loop, Torch
hands it to ``torch._VF`` (cuDNN on CUDA, oneDNN on the CPU). A GRU with
``reset_after=False``, which PyTorch has no kernel for, scans its steps in Python.

As in Burn, the inputs are batch first by default (``[batch, seq, d_input]``),
the layers start from a zero state unless one is given, and the weights and the
biases are drawn from ``XavierNormal(gain=1)`` with ``fan_in`` the transform's
input size and ``fan_out = d_hidden``. PyTorch draws everything from
``U(-1/sqrt(d_hidden), 1/sqrt(d_hidden))`` instead and is sequence first by default.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ember.backend.device import Device
from ember.backend.errors import ArgumentError, ShapeError, fmt_shape
from ember.config import Config
from ember.config.fields import PositiveInt
from ember.module import Module
from ember.nn.initializer import Initializer, XavierNormal
from ember.nn.linear import Linear
from ember.nn.rnn_cell import gru_cell, lstm_cell
from ember.nn.rnn_sequence import gru_sequence, lstm_sequence
from ember.record.adapter import PYTORCH
from ember.tensor import Tensor


class LstmState(NamedTuple):
    """The state an LSTM carries between time steps: ``(cell, hidden)``.

    For :class:`Lstm` both are ``[batch, d_hidden]``; for :class:`BiLstm` they are
    ``[2, batch, d_hidden]``, the forward direction first.
    """

    cell: Tensor
    hidden: Tensor


def _fused_linear(
    d_input: int,
    d_hidden: int,
    gates: int,
    bias: bool,
    initializer: Initializer,
    device: Device | None,
) -> Linear:
    """A Linear with ``gates`` blocks of ``d_hidden`` outputs, each drawn as its own layer."""
    fans = {"fan_in": d_input, "fan_out": d_hidden}  # per gate, as Burn's separate gates
    width = gates * d_hidden
    weight = initializer.init_param([d_input, width], device, **fans)
    bias_param = initializer.init_param([width], device, **fans) if bias else None
    return Linear(weight, bias_param)


_SEQUENCE_OPS = True
"""Whether the layers run their time loop as one op (:mod:`ember.nn.rnn_sequence`); False
gives the per-step cell ops of :mod:`ember.nn.rnn_cell` scanned in Python, which the
benchmarks keep as the baseline."""


def _bias_sum(*linears: Linear) -> Tensor | None:
    biases = [linear.bias.val() for linear in linears if linear.bias is not None]
    if not biases:
        return None
    return biases[0] if len(biases) == 1 else biases[0] + biases[1]


def _time_major(layer: str, x: Tensor, d_input: int, batch_first: bool) -> Tensor:
    """The input as ``[seq, batch, d_input]``, after checking its shape."""
    if x.rank != 3 or x.shape[2] != d_input:
        layout = "batch, seq" if batch_first else "seq, batch"
        raise ShapeError(
            f"{layer}: expected an input of shape [{layout}, {d_input}] (d_input), "
            f"got {fmt_shape(x.shape)}"
        )
    return x.swap_dims(0, 1) if batch_first else x


def _project(xt: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``xt @ weight + bias`` for the whole ``[seq, batch, d_input]`` sequence: one product."""
    seq, batch, d_input = xt.shape
    y = xt.reshape([seq * batch, d_input]).matmul(weight)
    if bias is not None:
        y = y + bias
    return y.reshape([seq, batch, weight.shape[1]])


def _state_part(layer: str, name: str, value: Any, shape: list[int]) -> Tensor:
    """One tensor of an initial state, checked, with a leading time dim of size 1."""
    if not isinstance(value, Tensor):
        raise ArgumentError(f"{layer}: the initial {name} must be a Tensor, got {type(value).__name__}")
    if list(value.shape) != shape:
        dims = "[batch, d_hidden]" if len(shape) == 2 else "[2, batch, d_hidden]"
        raise ShapeError(
            f"{layer}: expected the initial {name} of shape {fmt_shape(shape)} {dims}, "
            f"got {fmt_shape(value.shape)}"
        )
    return value.reshape([1, *shape])


def _lstm_initial(layer: str, state: Any, shape: list[int], like: Tensor) -> tuple[Tensor, Tensor]:
    if state is None:
        zeros = Tensor.zeros([1, *shape], like.device, dtype=like.dtype)
        return zeros, zeros
    if not isinstance(state, LstmState):
        raise ArgumentError(
            f"{layer}: the initial state must be an LstmState(cell, hidden), "
            f"got {type(state).__name__}"
        )
    return (
        _state_part(layer, "cell", state.cell, shape),
        _state_part(layer, "hidden", state.hidden, shape),
    )


def _lstm_scan(
    xp: Tensor, w_hh: Tensor, cell: Tensor, hidden: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Runs the LSTM recurrence over the time dim 0 of ``xp``.

    Args:
        xp: ``[seq, *dirs, batch, 4 * d_hidden]``, the input projections with all biases.
        w_hh: ``[*dirs, d_hidden, 4 * d_hidden]``.
        cell, hidden: ``[1, *dirs, batch, d_hidden]``.

    Returns:
        The hidden states ``[seq, *dirs, batch, d_hidden]``, the last cell, the last hidden.
    """
    outputs = []
    for x_t in xp.split(1, dim=0):
        # One fused op per step: a single autodiff node instead of a dozen small ones.
        hidden, cell = lstm_cell(x_t, hidden, cell, w_hh)
        outputs.append(hidden)
    return Tensor.cat(outputs, 0), cell, hidden


def _gru_scan(
    xp: Tensor, w_hh: Tensor, b_hh: Tensor | None, hidden: Tensor, reset_after: bool
) -> tuple[Tensor, Tensor]:
    """Runs the GRU recurrence over the time dim 0 of ``xp``.

    Args:
        xp: ``[seq, batch, 3 * d_hidden]``, the input projections with the input bias
            (and, without ``reset_after``, the hidden bias too).
        w_hh: ``[d_hidden, 3 * d_hidden]``.
        b_hh: the hidden bias ``[3 * d_hidden]`` with ``reset_after``, else None.
        hidden: ``[1, batch, d_hidden]``.
        reset_after: whether the reset gate scales ``W_hn h + b_hn`` (True, as PyTorch)
            or ``h`` before its product (False).

    Returns:
        The hidden states ``[seq, batch, d_hidden]`` and the last one.
    """
    outputs = []
    if reset_after:
        # One fused op per step, as the LSTM.
        for x_t in xp.split(1, dim=0):
            hidden = gru_cell(x_t, hidden, w_hh, b_hh)
            outputs.append(hidden)
        return Tensor.cat(outputs, 0), hidden
    d = w_hh.shape[0]
    w_rz, w_n = w_hh.split([2 * d, d], dim=-1)
    for x_t in xp.split(1, dim=0):
        x_rz, x_n = x_t.split([2 * d, d], dim=-1)
        r, z = (x_rz + hidden.matmul(w_rz)).sigmoid().split(d, dim=-1)
        n = (x_n + (r * hidden).matmul(w_n)).tanh()
        hidden = n + z * (hidden - n)  # (1 - z) * n + z * h
        outputs.append(hidden)
    return Tensor.cat(outputs, 0), hidden


def _stacked(tensors: list[Tensor]) -> Tensor:
    """One weight (or bias) per direction as the ``[dirs, ...]`` operand of a sequence op."""
    if len(tensors) == 1:
        return tensors[0].reshape([1, *tensors[0].shape])
    return Tensor.stack(tensors)


def _bias_or_zeros(bias: Tensor | None, width: int, like: Tensor) -> Tensor:
    return Tensor.zeros([width], like.device, dtype=like.dtype) if bias is None else bias


def _lstm_layers(layers: list[Lstm], xt: Tensor, cell: Tensor, hidden: Tensor
                 ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Runs the directions ``layers`` over ``xt [seq, batch, d_input]`` as one op; ``cell``
    and ``hidden`` are ``[1, dirs, batch, d_hidden]`` or ``[1, batch, d_hidden]``.

    Returns the hidden states ``[seq, batch, dirs * d_hidden]``, the last cell, the last
    hidden state (``[dirs, batch, d_hidden]``)."""
    d = layers[0].d_hidden
    states = [s.reshape([len(layers), xt.shape[1], d]) for s in (hidden, cell)]
    w_ih = _stacked([layer.input_transform.weight.val() for layer in layers])
    w_hh = _stacked([layer.hidden_transform.weight.val() for layer in layers])
    biases = [_bias_sum(layer.input_transform, layer.hidden_transform) for layer in layers]
    bias = _stacked([_bias_or_zeros(b, 4 * d, xt) for b in biases])
    outputs, h_n, c_n = lstm_sequence(xt, *states, w_ih, w_hh, bias)
    return outputs, c_n, h_n


def _batch_major(outputs: Tensor, batch_first: bool) -> Tensor:
    return outputs.swap_dims(0, 1) if batch_first else outputs


def _empty_outputs(xt: Tensor, width: int, batch_first: bool) -> Tensor:
    seq, batch = xt.shape[:2]
    shape = [batch, seq, width] if batch_first else [seq, batch, width]
    return Tensor.zeros(shape, xt.device, dtype=xt.dtype)


# ---------------------------------------------------------------------------- LSTM
class LstmConfig(Config):
    """Configuration of an :class:`Lstm` layer.

    Args:
        d_input: the size of each input vector.
        d_hidden: the size of the hidden and cell states.
        bias: whether the input and hidden transforms add a learned bias. Default: True.
        initializer: how to fill the weights and biases. Default: ``XavierNormal(gain=1)``,
            as Burn (PyTorch: uniform on ``[-1/sqrt(d_hidden), 1/sqrt(d_hidden)]``).
        batch_first: whether inputs and outputs are ``[batch, seq, ...]`` (True, as Burn)
            or ``[seq, batch, ...]`` (PyTorch's default).

    Example:
        >>> from ember.nn.rnn import LstmConfig
        >>> lstm = LstmConfig(3, 5).init()
        >>> lstm.input_transform.weight.shape, lstm.hidden_transform.weight.shape
        ((3, 20), (5, 20))
    """

    d_input: PositiveInt
    d_hidden: PositiveInt
    bias: bool = True
    initializer: Initializer = XavierNormal(gain=1.0)
    batch_first: bool = True

    def init(self, device: Device | None = None) -> Lstm:
        """A new :class:`Lstm` with freshly initialized parameters on ``device``."""
        args = (4, self.bias, self.initializer, device)
        return Lstm(
            input_transform=_fused_linear(self.d_input, self.d_hidden, *args),
            hidden_transform=_fused_linear(self.d_hidden, self.d_hidden, *args),
            batch_first=self.batch_first,
        )


class Lstm(Module):
    """A long short-term memory layer (Hochreiter & Schmidhuber, 1997).

    At each step ``t``, with ``σ`` the sigmoid and ``⊙`` the element-wise product::

        i, f, g, o = split(x_t @ W_ih + b_ih + h_{t-1} @ W_hh + b_hh)
        c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(g)
        h_t = σ(o) ⊙ tanh(c_t)

    ``W_ih`` is ``input_transform`` and ``W_hh`` is ``hidden_transform``, their columns
    in the gate blocks ``[i | f | g | o]`` (see :mod:`ember.nn.rnn`). PyTorch's
    ``nn.LSTM`` weights (one layer, ``weight_ih_l0``, ``weight_hh_l0``, ``bias_ih_l0``,
    ``bias_hh_l0``) load through the PyTorch adapter.

    Args:
        input_transform: ``[d_input, 4 * d_hidden]`` weight and ``[4 * d_hidden]`` bias.
        hidden_transform: ``[d_hidden, 4 * d_hidden]`` weight and ``[4 * d_hidden]`` bias.
        batch_first: whether the batch dim comes before the time dim.

    Shape:
        - Input: ``[batch, seq, d_input]`` (``[seq, batch, d_input]`` if not batch first),
          and optionally an :class:`LstmState` of ``[batch, d_hidden]`` tensors (zeros
          when omitted).
        - Output: the hidden state of every step, ``[batch, seq, d_hidden]`` (or
          ``[seq, batch, d_hidden]``), and the last :class:`LstmState`.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.rnn import LstmConfig
        >>> device = ember.device("ndarray")
        >>> lstm = LstmConfig(3, 5).init(device)
        >>> outputs, state = lstm(Tensor.ones([2, 7, 3], device))
        >>> outputs.shape, state.cell.shape, state.hidden.shape
        ((2, 7, 5), (2, 5), (2, 5))
        >>> bool((outputs[:, -1] == state.hidden).all())
        True
    """

    input_transform: Linear
    hidden_transform: Linear
    batch_first: bool = True

    @property
    def d_input(self) -> int:
        return self.input_transform.d_input

    @property
    def d_hidden(self) -> int:
        return self.hidden_transform.d_input

    def forward(self, x: Tensor, state: LstmState | None = None) -> tuple[Tensor, LstmState]:
        xt = _time_major("Lstm", x, self.d_input, self.batch_first)
        shape = [xt.shape[1], self.d_hidden]
        cell, hidden = _lstm_initial("Lstm", state, shape, xt)
        if xt.shape[0] == 0:
            empty = _empty_outputs(xt, self.d_hidden, self.batch_first)
            return empty, LstmState(cell.reshape(shape), hidden.reshape(shape))
        if _SEQUENCE_OPS:
            outputs, cell, hidden = _lstm_layers([self], xt, cell, hidden)
        else:
            bias = _bias_sum(self.input_transform, self.hidden_transform)
            xp = _project(xt, self.input_transform.weight.val(), bias)
            w_hh = self.hidden_transform.weight.val()
            outputs, cell, hidden = _lstm_scan(xp, w_hh, cell, hidden)
        state = LstmState(cell.reshape(shape), hidden.reshape(shape))
        return _batch_major(outputs, self.batch_first), state


class BiLstmConfig(Config):
    """Configuration of a :class:`BiLstm` layer.

    Args:
        d_input: the size of each input vector.
        d_hidden: the size of the hidden and cell states of each direction.
        bias: whether the transforms add a learned bias. Default: True.
        initializer: how to fill the weights and biases. Default: ``XavierNormal(gain=1)``,
            as Burn.
        batch_first: whether inputs and outputs are ``[batch, seq, ...]``. Default: True.

    Example:
        >>> from ember.nn.rnn import BiLstmConfig
        >>> bilstm = BiLstmConfig(3, 5).init()
        >>> bilstm.reverse_lstm.hidden_transform.weight.shape
        (5, 20)
    """

    d_input: PositiveInt
    d_hidden: PositiveInt
    bias: bool = True
    initializer: Initializer = XavierNormal(gain=1.0)
    batch_first: bool = True

    def init(self, device: Device | None = None) -> BiLstm:
        """A new :class:`BiLstm`: two independently initialized :class:`Lstm` layers."""
        lstm = LstmConfig(
            self.d_input, self.d_hidden, bias=self.bias, initializer=self.initializer,
            batch_first=self.batch_first,
        )  # fmt: skip
        return BiLstm(lstm.init(device), lstm.init(device), batch_first=self.batch_first)


class BiLstm(Module):
    """A bidirectional LSTM: one :class:`Lstm` reads the sequence forward, another backward.

    The output of each step is the forward hidden state followed by the backward one.
    Both directions run in the same time loop, as one batched product per step.
    PyTorch's ``nn.LSTM(bidirectional=True)`` weights load through the PyTorch adapter
    (the ``*_reverse`` tensors go to ``reverse_lstm``).

    Args:
        forward_lstm: the layer that reads from the first step to the last.
        reverse_lstm: the layer that reads from the last step to the first.
        batch_first: whether the batch dim comes before the time dim.

    Shape:
        - Input: ``[batch, seq, d_input]`` (``[seq, batch, d_input]`` if not batch first),
          and optionally an :class:`LstmState` of ``[2, batch, d_hidden]`` tensors, the
          forward direction first (zeros when omitted).
        - Output: ``[batch, seq, 2 * d_hidden]`` (or ``[seq, batch, 2 * d_hidden]``), and
          the last :class:`LstmState` of each direction, ``[2, batch, d_hidden]`` tensors
          (the backward direction's last state is the one at the first step).

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.rnn import BiLstmConfig
        >>> device = ember.device("ndarray")
        >>> bilstm = BiLstmConfig(3, 5).init(device)
        >>> outputs, state = bilstm(Tensor.ones([2, 7, 3], device))
        >>> outputs.shape, state.hidden.shape
        ((2, 7, 10), (2, 2, 5))
    """

    forward_lstm: Lstm
    reverse_lstm: Lstm
    batch_first: bool = True

    @property
    def d_input(self) -> int:
        return self.forward_lstm.d_input

    @property
    def d_hidden(self) -> int:
        return self.forward_lstm.d_hidden

    def forward(self, x: Tensor, state: LstmState | None = None) -> tuple[Tensor, LstmState]:
        xt = _time_major("BiLstm", x, self.d_input, self.batch_first)
        seq, batch = xt.shape[:2]
        d = self.d_hidden
        shape = [2, batch, d]
        cell, hidden = _lstm_initial("BiLstm", state, shape, xt)
        if seq == 0:
            empty = _empty_outputs(xt, 2 * d, self.batch_first)
            return empty, LstmState(cell.reshape(shape), hidden.reshape(shape))
        fwd, rev = self.forward_lstm, self.reverse_lstm
        if _SEQUENCE_OPS:
            outputs, cell, hidden = _lstm_layers([fwd, rev], xt, cell, hidden)
            state = LstmState(cell.reshape(shape), hidden.reshape(shape))
            return _batch_major(outputs, self.batch_first), state
        # Both directions in one product: their input weights side by side.
        weight = Tensor.cat([fwd.input_transform.weight.val(), rev.input_transform.weight.val()], 1)
        biases = [_bias_sum(fwd.input_transform, fwd.hidden_transform),
                  _bias_sum(rev.input_transform, rev.hidden_transform)]  # fmt: skip
        bias = None if biases[0] is None else Tensor.cat(biases, 0)
        xp_fwd, xp_rev = _project(xt, weight, bias).split(4 * d, dim=-1)
        # The backward direction reads the sequence reversed: [seq, 2, batch, 4 * d_hidden].
        xp = Tensor.stack([xp_fwd, xp_rev.flip([0])], 1)
        w_hh = Tensor.stack([fwd.hidden_transform.weight.val(), rev.hidden_transform.weight.val()])
        outputs, cell, hidden = _lstm_scan(xp, w_hh, cell, hidden)
        out_fwd, out_rev = outputs.split(1, dim=1)
        outputs = Tensor.cat([out_fwd, out_rev.flip([0])], -1).reshape([seq, batch, 2 * d])
        state = LstmState(cell.reshape(shape), hidden.reshape(shape))
        return _batch_major(outputs, self.batch_first), state


# ---------------------------------------------------------------------------- GRU
class GruConfig(Config):
    """Configuration of a :class:`Gru` layer.

    Args:
        d_input: the size of each input vector.
        d_hidden: the size of the hidden state.
        bias: whether the input and hidden transforms add a learned bias. Default: True.
        reset_after: whether the reset gate scales the hidden product ``W_hn h + b_hn``
            (True, as Burn's default and PyTorch) or the hidden state before its
            product (False, the original formulation of Cho et al., 2014).
        initializer: how to fill the weights and biases. Default: ``XavierNormal(gain=1)``,
            as Burn (PyTorch: uniform on ``[-1/sqrt(d_hidden), 1/sqrt(d_hidden)]``).
        batch_first: whether inputs and outputs are ``[batch, seq, ...]`` (True, as Burn)
            or ``[seq, batch, ...]`` (PyTorch's default).

    Example:
        >>> from ember.nn.rnn import GruConfig
        >>> gru = GruConfig(3, 5).init()
        >>> gru.input_transform.weight.shape, gru.reset_after
        ((3, 15), True)
    """

    d_input: PositiveInt
    d_hidden: PositiveInt
    bias: bool = True
    reset_after: bool = True
    initializer: Initializer = XavierNormal(gain=1.0)
    batch_first: bool = True

    def init(self, device: Device | None = None) -> Gru:
        """A new :class:`Gru` with freshly initialized parameters on ``device``."""
        args = (3, self.bias, self.initializer, device)
        return Gru(
            input_transform=_fused_linear(self.d_input, self.d_hidden, *args),
            hidden_transform=_fused_linear(self.d_hidden, self.d_hidden, *args),
            reset_after=self.reset_after,
            batch_first=self.batch_first,
        )


class Gru(Module):
    """A gated recurrent unit layer (Cho et al., 2014).

    At each step ``t``, with ``σ`` the sigmoid, ``⊙`` the element-wise product, and the
    columns of ``W_ih`` (``input_transform``) and ``W_hh`` (``hidden_transform``) in
    the gate blocks ``[r | z | n]``::

        r = σ(x_t @ W_ir + b_ir + h_{t-1} @ W_hr + b_hr)
        z = σ(x_t @ W_iz + b_iz + h_{t-1} @ W_hz + b_hz)
        n = tanh(x_t @ W_in + b_in + r ⊙ (h_{t-1} @ W_hn + b_hn))    # reset_after
        n = tanh(x_t @ W_in + b_in + (r ⊙ h_{t-1}) @ W_hn + b_hn)    # not reset_after
        h_t = (1 - z) ⊙ n + z ⊙ h_{t-1}

    With ``reset_after`` (the default) this is PyTorch's ``nn.GRU``, whose weights
    load through the PyTorch adapter.

    Args:
        input_transform: ``[d_input, 3 * d_hidden]`` weight and ``[3 * d_hidden]`` bias.
        hidden_transform: ``[d_hidden, 3 * d_hidden]`` weight and ``[3 * d_hidden]`` bias.
        reset_after: where the reset gate applies (see above).
        batch_first: whether the batch dim comes before the time dim.

    Shape:
        - Input: ``[batch, seq, d_input]`` (``[seq, batch, d_input]`` if not batch first),
          and optionally the initial hidden state ``[batch, d_hidden]`` (zeros when
          omitted).
        - Output: the hidden state of every step, ``[batch, seq, d_hidden]`` (or
          ``[seq, batch, d_hidden]``), and the last hidden state ``[batch, d_hidden]``.

    Example:
        >>> import ember
        >>> from ember import Tensor
        >>> from ember.nn.rnn import GruConfig
        >>> device = ember.device("ndarray")
        >>> gru = GruConfig(3, 5).init(device)
        >>> outputs, hidden = gru(Tensor.ones([2, 7, 3], device), Tensor.zeros([2, 5], device))
        >>> outputs.shape, hidden.shape
        ((2, 7, 5), (2, 5))
    """

    input_transform: Linear
    hidden_transform: Linear
    reset_after: bool = True
    batch_first: bool = True

    @property
    def d_input(self) -> int:
        return self.input_transform.d_input

    @property
    def d_hidden(self) -> int:
        return self.hidden_transform.d_input

    def forward(self, x: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        xt = _time_major("Gru", x, self.d_input, self.batch_first)
        shape = [xt.shape[1], self.d_hidden]
        if state is None:
            hidden = Tensor.zeros([1, *shape], xt.device, dtype=xt.dtype)
        else:
            hidden = _state_part("Gru", "hidden state", state, shape)
        if xt.shape[0] == 0:
            return _empty_outputs(xt, self.d_hidden, self.batch_first), hidden.reshape(shape)
        b_hh = self.hidden_transform.bias
        if self.reset_after and _SEQUENCE_OPS:
            transforms = (self.input_transform, self.hidden_transform)
            weights = [_stacked([t.weight.val()]) for t in transforms]
            biases = [None if t.bias is None else t.bias.val() for t in transforms]
            biases = [_stacked([_bias_or_zeros(b, 3 * shape[1], xt)]) for b in biases]
            outputs, h_n = gru_sequence(xt, hidden.reshape([1, *shape]), *weights, *biases)
            return _batch_major(outputs, self.batch_first), h_n.reshape(shape)
        if self.reset_after:
            # The hidden bias of the candidate sits inside the reset product: keep it apart.
            bias = None if self.input_transform.bias is None else self.input_transform.bias.val()
            b_hh = None if b_hh is None else b_hh.val()
        else:
            bias, b_hh = _bias_sum(self.input_transform, self.hidden_transform), None
        xp = _project(xt, self.input_transform.weight.val(), bias)
        w_hh = self.hidden_transform.weight.val()
        outputs, hidden = _gru_scan(xp, w_hh, b_hh, hidden, self.reset_after)
        return _batch_major(outputs, self.batch_first), hidden.reshape(shape)


# ---------------------------------------------------------------------------- PyTorch
_PYTORCH_NAMES = {
    "weight_ih_l0": ("input_transform", "weight"),
    "bias_ih_l0": ("input_transform", "bias"),
    "weight_hh_l0": ("hidden_transform", "weight"),
    "bias_hh_l0": ("hidden_transform", "bias"),
}


@PYTORCH.register(Lstm)
@PYTORCH.register(Gru)
def _from_pytorch(module: Module, record: dict[str, Any]) -> dict[str, Any]:
    """PyTorch's ``nn.LSTM`` / ``nn.GRU`` (first layer) into the two fused transforms.

    The gate order is the same, so the weights only need the transpose that the
    Linear rule applies next. Names of other layers (``*_l1``) are left to be reported.
    """
    adapted: dict[str, Any] = {}
    for name, value in record.items():
        if name in _PYTORCH_NAMES:
            transform, field = _PYTORCH_NAMES[name]
            adapted.setdefault(transform, {})[field] = value
        else:
            adapted[name] = value
    return adapted


@PYTORCH.register(BiLstm)
def _bilstm_from_pytorch(module: BiLstm, record: dict[str, Any]) -> dict[str, Any]:
    """PyTorch's bidirectional ``nn.LSTM``: the ``*_reverse`` tensors are the backward layer."""
    adapted: dict[str, Any] = {}
    for name, value in record.items():
        base = name.removesuffix("_reverse")
        if base in _PYTORCH_NAMES:
            direction = "reverse_lstm" if base != name else "forward_lstm"
            adapted.setdefault(direction, {})[base] = value
        else:
            adapted[name] = value
    return adapted
