"""Recurrent layers as ONNX ``LSTM`` and ``GRU`` nodes, exported whole: their time loop is
Python, so tracing their ops would unroll it and fix the sequence length.

ember keeps each layer's gates side by side in two linear maps (``[d_in, G * d_hidden]``,
see :mod:`ember.nn.rnn`) in PyTorch's gate order; ONNX wants ``[G * d_hidden, d_in]`` per
direction in its own order. The weights are rearranged at export time into initializers
named after the layer (``<path>.W``, ``.R``, ``.B``).
"""

from __future__ import annotations

import numpy as np

from ember.module import Module
from ember.nn.rnn import BiLstm, Gru, Lstm
from ember.onnx.export.emitter import Emitter
from ember.onnx.export.registry import module_exporter
from ember.onnx.export.tracer import OpCall

LSTM_GATES = [0, 3, 1, 2]
"""ember's LSTM blocks ``[i, f, g, o]`` in ONNX's order ``[i, o, f, c]``."""
GRU_GATES = [1, 0, 2]
"""ember's GRU blocks ``[r, z, n]`` in ONNX's order ``[z, r, h]``."""


def _value(e: Emitter, tensor) -> np.ndarray:
    return np.asarray(e.trace.value(tensor.into_primitive()))


def _gates(matrix: np.ndarray, order: list[int], hidden: int) -> np.ndarray:
    """``matrix``'s last dim, in blocks of ``hidden``, rearranged into ``order``."""
    blocks = [matrix[..., g * hidden:(g + 1) * hidden] for g in order]
    return np.concatenate(blocks, axis=-1)


def _direction(e: Emitter, layer: Module, order: list[int], hidden: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """One direction's ``W [G*H, d_in]``, ``R [G*H, H]`` and ``B [2*G*H]`` (zeros for an
    absent bias)."""
    w = _gates(_value(e, layer.input_transform.weight.val()), order, hidden).T
    r = _gates(_value(e, layer.hidden_transform.weight.val()), order, hidden).T
    biases = []
    for transform in (layer.input_transform, layer.hidden_transform):
        bias = transform.bias
        values = np.zeros(len(order) * hidden, w.dtype) if bias is None else _value(e, bias.val())
        biases.append(_gates(values, order, hidden))
    return w, r, np.concatenate(biases)


def _recurrent(e: Emitter, call: OpCall, op_type: str, layers: list[Module], order: list[int],
               hidden: int, batch_first: bool, states: list[str], **attrs) -> list[str]:  # fmt: skip
    """The node's outputs ``Y [seq, dirs, batch, H]``, ``Y_h`` (and ``Y_c``)
    ``[dirs, batch, H]``; ``states`` are the initial states in ONNX's order (h, then c)."""
    x = e.input(call, 0)
    if batch_first:
        x = e.node("Transpose", [x], perm=[1, 0, 2])
    weights = [_direction(e, layer, order, hidden) for layer in layers]
    path = call.module_path or "model"
    w, r, b = (e.const(np.stack([d[i] for d in weights]), f"{path}.{name}")
               for i, name in enumerate("WRB"))  # fmt: skip
    dirs = len(layers)
    initial = [e.node("Reshape", [s, e.ints([dirs, -1, hidden])]) for s in states]
    inputs = [x, w, r, b, "", *initial]
    while not inputs[-1]:
        inputs.pop()
    outputs = 3 if op_type == "LSTM" else 2
    direction = "bidirectional" if dirs == 2 else "forward"
    return e.node_outputs(op_type, inputs, outputs, hidden_size=hidden, direction=direction,
                          **attrs)  # fmt: skip


def _sequence_out(e: Emitter, call: OpCall, y: str, dirs: int, batch_first: bool) -> None:
    """``Y [seq, dirs, batch, H]`` as ember's ``[seq, batch, dirs * H]`` (batch first if so)."""
    if dirs == 1:
        y = e.node("Squeeze", [y, e.ints([1])])
    else:
        y = e.node("Transpose", [y], perm=[0, 2, 1, 3])
        y = e.node("Reshape", [y, e.ints([0, 0, -1])])
    if batch_first:
        e.node("Transpose", [y], [e.output(call, 0)], perm=[1, 0, 2])
    else:
        e.bind(call, y, 0)


def _state_out(e: Emitter, call: OpCall, state: str, i: int, dirs: int) -> None:
    """A final state ``[dirs, batch, H]`` as ember's ``[batch, H]`` (one direction) or
    ``[2, batch, H]``."""
    if dirs == 1:
        e.node("Squeeze", [state, e.ints([0])], [e.output(call, i)])
    else:
        e.node("Identity", [state], [e.output(call, i)])


@module_exporter(Lstm, BiLstm)
def lstm(e: Emitter, call: OpCall) -> None:
    """Inputs ``x`` (and an ``LstmState(cell, hidden)``); outputs the sequence, then the final
    cell and hidden state."""
    layer = call.module
    layers = [layer] if isinstance(layer, Lstm) else [layer.forward_lstm, layer.reverse_lstm]
    hidden = layers[0].d_hidden
    states = []
    if len(call.inputs) == 3:  # x, cell, hidden: ONNX takes h, then c
        states = [e.input(call, 2), e.input(call, 1)]
    y, y_h, y_c = _recurrent(e, call, "LSTM", layers, LSTM_GATES, hidden, layer.batch_first,
                             states)  # fmt: skip
    _sequence_out(e, call, y, len(layers), layer.batch_first)
    _state_out(e, call, y_c, 1, len(layers))
    _state_out(e, call, y_h, 2, len(layers))


@module_exporter(Gru)
def gru(e: Emitter, call: OpCall) -> None:
    """Inputs ``x`` (and a hidden state); outputs the sequence and the final hidden state.
    ember's reset-after GRU is ONNX's ``linear_before_reset=1``."""
    layer = call.module
    states = [e.input(call, 1)] if len(call.inputs) == 2 else []
    y, y_h = _recurrent(e, call, "GRU", [layer], GRU_GATES, layer.d_hidden, layer.batch_first,
                        states, linear_before_reset=int(layer.reset_after))  # fmt: skip
    _sequence_out(e, call, y, 1, layer.batch_first)
    _state_out(e, call, y_h, 1, 1)
