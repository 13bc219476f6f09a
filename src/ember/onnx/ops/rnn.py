"""Recurrent ops: LSTM, GRU and RNN.

ONNX keeps a recurrent layer's weights per direction, its gates stacked along the rows:
``W`` is ``[directions, gates * hidden, input]``, ``R`` is ``[directions, gates * hidden,
hidden]`` and ``B`` is ``[directions, 2 * gates * hidden]`` (the input biases, then the
hidden biases). The gate order is ``i, o, f, c`` for LSTM and ``z, r, h`` for GRU. The
sequence is time major (``[seq, batch, input]``) unless ``layout=1``, and ``Y`` is
``[seq, directions, batch, hidden]``.

Two translations:

* When the weights are constants and the node is plain (default activations; no clip,
  peepholes, coupled gates, or sequence lengths short of the sequence), it becomes an
  ember layer:
  :class:`~ember.nn.rnn.Lstm` (forward or reverse), :class:`~ember.nn.rnn.BiLstm`, or
  :class:`~ember.nn.rnn.Gru` (``linear_before_reset`` is ember's ``reset_after``), with
  the gate blocks reordered to ember's ``i, f, g, o`` and ``r, z, n``.
* Otherwise, the generated code runs the recurrence itself: the whole sequence is
  projected in one product (every direction at once), then a loop over the time steps
  updates a ``[1, directions, batch, hidden]`` state. The reverse direction reads the
  sequence backwards (with ``sequence_lens``: each batch entry's own valid steps
  backwards). Steps past an entry's length keep its state and output zeros.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ember.onnx.context import NodeContext, Value, literal
from ember.onnx.registry import converter
from ember.tensor import DType

Size = int | str  # a size known at import time, or the expression of one

_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULT_ACTIVATIONS = {
    "LSTM": ("sigmoid", "tanh", "tanh"),
    "GRU": ("sigmoid", "tanh"),
    "RNN": ("tanh",),
}
# ember's gate blocks, as indices of ONNX's: Lstm [i, f, g, o] from [i, o, f, c], Gru
# [r, z, n] from [z, r, h].
_EMBER_ORDER = {"LSTM": (0, 2, 3, 1), "GRU": (1, 0, 2)}


@dataclass(frozen=True)
class _Activation:
    """An ONNX activation as an expression of ``{x}`` (a name or a parenthesized
    expression) and ``{alpha}``/``{beta}``, with ONNX's default alpha and beta (None for
    an activation that takes no such value)."""

    template: str
    alpha: float | None = None
    beta: float | None = None


_ACTIVATIONS = {
    "sigmoid": _Activation("{x}.sigmoid()"),
    "tanh": _Activation("{x}.tanh()"),
    "relu": _Activation("activation.relu({x})"),
    "affine": _Activation("{x} * {alpha} + {beta}", 1.0, 0.0),
    "leakyrelu": _Activation("activation.leaky_relu({x}, {alpha})", 0.01),
    "thresholdedrelu": _Activation("{x}.mask_fill({x}.lower_equal({alpha}), 0.0)", 1.0),
    "scaledtanh": _Activation("({x} * {beta}).tanh() * {alpha}", 1.0, 1.0),
    "hardsigmoid": _Activation("({x} * {alpha} + {beta}).clamp(0.0, 1.0)", 0.2, 0.5),
    "elu": _Activation("activation.elu({x}, {alpha})", 1.0),
    "softsign": _Activation("{x} / ({x}.abs() + 1.0)"),
    "softplus": _Activation("activation.softplus({x})"),
}

_COMMON_ATTRS = ("activation_alpha", "activation_beta", "activations", "clip", "direction",
                 "hidden_size")  # fmt: skip
_EXTRA_ATTRS = {"LSTM": ("input_forget",), "GRU": ("linear_before_reset",), "RNN": ()}

_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9.]*")


def _apply(template: str, x: str, alpha: float | None, beta: float | None) -> str:
    arg = x if _NAME.fullmatch(x) else f"({x})"
    return template.format(x=arg, alpha=literal(alpha), beta=literal(beta))


def _reorder(value: np.ndarray, order: tuple[int, ...], hidden: int) -> np.ndarray:
    """The gate blocks (``hidden`` rows each, along axis 0) of ``value`` in ``order``."""
    blocks = value.reshape(len(order), hidden, *value.shape[1:])
    return blocks[list(order)].reshape(value.shape)


@dataclass(frozen=True)
class _Weights:
    """The names of the weights the generated loop multiplies by."""

    w: str  # [directions, input, gates * hidden]
    r: str  # [directions, hidden, gates * hidden] (GRU without linear_before_reset: z, r)
    r_h: str | None  # GRU without linear_before_reset: the candidate's hidden weight
    b_in: str | None  # the bias added to the input projections
    b_hidden: str | None  # GRU with linear_before_reset: the hidden bias
    peep: tuple[str, str, str] | None  # LSTM: the peepholes of i, o, f


@dataclass(frozen=True)
class _Step:
    """The names one time step of the generated loop reads and writes: the step's input
    projection, the state before it and after it, and the weights."""

    x_t: str
    h: str
    c: str
    new_h: str
    new_c: str
    weights: _Weights


def _transposed(array: np.ndarray) -> np.ndarray:
    return array.transpose(0, 2, 1)


def _transposed_expr(expr: str) -> str:
    return f"{expr}.swap_dims(1, 2)"


def _columns(expr: str, start: int, length: int) -> str:
    return f"{expr}.narrow(-1, {start}, {length})"


class _Recurrent:
    """One LSTM, GRU or RNN node: its attributes and inputs, read and checked."""

    def __init__(self, node: NodeContext) -> None:
        self.node = node
        self.op = node.op_type
        self.gates = _GATES[self.op]
        self.hidden = int(node.attr("hidden_size", 0)) or self._hidden_from_r()
        direction = node.attr("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            node.unsupported(f"direction {direction!r} is not one of forward, reverse, "
                             f"bidirectional")
        self.direction = direction
        self.directions = 2 if direction == "bidirectional" else 1
        self.layout = int(node.attr("layout", 0))
        if self.layout not in (0, 1):
            node.unsupported(f"layout {self.layout} is not 0 or 1")
        self.clip = node.attr("clip", None)
        self.input_forget = bool(node.attr("input_forget", 0))
        self.linear_before_reset = bool(node.attr("linear_before_reset", 0))
        self.x, self.w, self.r = node.input(0), node.input(1), node.input(2)
        self.b, self.lens, self.h0 = node.input(3), node.input(4), node.input(5)
        self.c0 = node.input(6) if self.op == "LSTM" else Value(node, "")
        self.p = node.input(7) if self.op == "LSTM" else Value(node, "")
        self.activations = self._activations()

    def _hidden_from_r(self) -> int:
        shape = self.node.input(2).shape
        if shape is None or not isinstance(shape[-1], int):
            self.node.unsupported("hidden_size is missing and R's shape is unknown")
        return int(shape[-1])

    def _activations(self) -> list[tuple[_Activation, float | None, float | None]]:
        """The activations of one direction, with their alpha and beta. ONNX lists them
        for every direction; alphas and betas are taken in order by the activations
        that use them (as onnxruntime does)."""
        node = self.node
        per_direction = len(_DEFAULT_ACTIVATIONS[self.op])
        names = [str(n).lower() for n in node.attr("activations", [])]
        if not names:
            names = list(_DEFAULT_ACTIVATIONS[self.op]) * self.directions
        if len(names) != per_direction * self.directions:
            node.unsupported(f"{len(names)} activations for {self.directions} direction(s); "
                             f"{per_direction} per direction are needed")
        alphas = [float(a) for a in node.attr("activation_alpha", [])]
        betas = [float(b) for b in node.attr("activation_beta", [])]
        chosen = []
        for name in names:
            if name not in _ACTIVATIONS:
                node.unsupported(f"the activation {name!r} is not supported (supported: "
                                 f"{', '.join(sorted(_ACTIVATIONS))})")
            act = _ACTIVATIONS[name]
            alpha = (alphas.pop(0) if alphas else act.alpha) if act.alpha is not None else None
            beta = (betas.pop(0) if betas else act.beta) if act.beta is not None else None
            chosen.append((act, alpha, beta))
        if chosen[:per_direction] != chosen[per_direction:] and self.directions == 2:
            node.unsupported("the two directions use different activations; ember runs them "
                             "together and needs the same ones")
        return chosen[:per_direction]

    def is_default(self) -> bool:
        defaults = [(_ACTIVATIONS[n], None, None) for n in _DEFAULT_ACTIVATIONS[self.op]]
        return self.activations == defaults

    # ------------------------------------------------------------------ as an ember layer
    def fits_layer(self) -> bool:
        """Whether an ember layer computes exactly this node."""
        weights = (self.w, self.r, self.b) if self.b.present else (self.w, self.r)
        consts = all(v.is_const for v in weights)
        return (
            self.op in ("LSTM", "GRU")
            and not (self.op == "GRU" and self.directions == 2)
            and consts and self.x.dtype is DType.F32 and self.w.const.dtype == np.float32
            and (not self.lens.present or self._full_lengths(self._seq()))
            and not self.p.present
            and self.clip is None and not self.input_forget and self.is_default()
        )  # fmt: skip

    def _layer_params(self, d: int, prefix: str) -> dict[str, np.ndarray]:
        order, h = _EMBER_ORDER[self.op], self.hidden
        params = {
            f"{prefix}input_transform.weight": _reorder(self.w.const[d], order, h).T,
            f"{prefix}hidden_transform.weight": _reorder(self.r.const[d], order, h).T,
        }
        if self.b.present:
            width = self.gates * h
            bias = self.b.const[d]
            params[f"{prefix}input_transform.bias"] = _reorder(bias[:width], order, h)
            params[f"{prefix}hidden_transform.bias"] = _reorder(bias[width:], order, h)
        return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in params.items()}

    def as_layer(self) -> list[str]:
        node, h = self.node, self.hidden
        d_input = int(self.w.const.shape[-1])
        batch_first = self.layout == 1
        bidirectional = self.directions == 2
        options = "" if self.b.present else ", bias=False"
        if self.op == "GRU":
            options += f", reset_after={self.linear_before_reset}"
        options += f", batch_first={batch_first}"
        kind = "BiLstm" if bidirectional else "Lstm" if self.op == "LSTM" else "Gru"
        config = f"{kind}Config({d_input}, {h}{options})"
        if bidirectional:
            params = {**self._layer_params(0, "forward_lstm."),
                      **self._layer_params(1, "reverse_lstm.")}  # fmt: skip
        else:
            params = self._layer_params(0, "")
        imports = [f"from ember.nn.rnn import {kind}, {kind}Config"]
        if self.op == "LSTM":
            imports[0] += ", LstmState"
        layer = node.layer(node.name, kind, f"{config}.init(device)", params, imports)
        time_dim = 1 if batch_first else 0
        x = self.x.expr
        if self.direction == "reverse":
            x = f"{x}.flip([{time_dim}])"
        # ONNX's states are [directions, batch, hidden] ([batch, directions, hidden] with
        # layout 1); ember's are [batch, hidden], or [2, batch, hidden] for BiLstm.
        dir_dim = 1 if batch_first else 0

        def state(value: Value) -> str:
            if bidirectional:
                return f"{value.expr}.swap_dims(0, 1)" if batch_first else value.expr
            return f"{value.expr}.squeeze({dir_dim})"

        args = x
        lines: list[str] = []
        if self.h0.present or self.c0.present:
            if self.op == "GRU":
                args += f", {state(self.h0)}"
            else:
                hidden = state(self.h0) if self.h0.present else None
                cell = state(self.c0) if self.c0.present else None
                if hidden is None or cell is None:
                    known = node.tmp("state")
                    lines.append(f"{known} = {hidden or cell}")
                    zeros = f"{known}.zeros_like()"
                    hidden, cell = hidden or zeros, cell or zeros
                args += f", LstmState({cell}, {hidden})"
        y, last = node.tmp("y"), node.tmp("state")
        lines.append(f"{y}, {last} = {layer}({args})")
        if self.direction == "reverse":
            lines.append(f"{y} = {y}.flip([{time_dim}])")
        out_y, out_h = node.outputs[0], node.outputs[1] if len(node.outputs) > 1 else None
        if bidirectional:
            # [.., .., 2 * hidden] to ONNX's [.., 2, .., hidden] (the directions' dim).
            split = f"{y}.reshape([*{y}.shape[:2], 2, {h}])"
            lines.append(f"{out_y} = {split}" + ("" if batch_first else ".swap_dims(1, 2)"))
        else:
            lines.append(f"{out_y} = {y}.unsqueeze_dim({2 if batch_first else 1})")
        hidden = last if self.op == "GRU" else f"{last}.hidden"
        finals = [(out_h, hidden)]
        if self.op == "LSTM" and len(node.outputs) > 2:
            finals.append((node.outputs[2], f"{last}.cell"))
        for out, value in finals:
            if out is None:
                continue
            if not bidirectional:
                value = f"{value}.unsqueeze_dim({dir_dim})"
            elif batch_first:
                value = f"{value}.swap_dims(0, 1)"
            lines.append(f"{out} = {value}")
        return lines

    # ------------------------------------------------------------------ as a loop
    def _weight(self, value: Value, hint: str, lines: list[str],
                array: Callable[[np.ndarray], np.ndarray], expr: Callable[[str], str]) -> str:
        """A weight derived from ``value``: a Param holding ``array(value)`` when it is a
        constant, else a local the generated code computes as ``expr(value)``."""
        if value.is_const:
            derived = np.ascontiguousarray(array(value.const))
            return self.node.param(derived, f"{self.node.name}_{hint}")
        name = self.node.tmp(hint)
        lines.append(f"{name} = {expr(value.expr)}")
        return name

    def _loop_weights(self, lines: list[str]) -> _Weights:
        """The weights as the loop multiplies them: ``[directions, in, gates * hidden]``
        on the right, biases ``[directions, 1, gates * hidden]``."""
        h, width = self.hidden, self.gates * self.hidden
        w = self._weight(self.w, "w", lines, _transposed, _transposed_expr)
        r_h = b_hidden = peep = None
        if self.op == "GRU" and not self.linear_before_reset:
            # The candidate's hidden product comes after the reset gate: its own weight.
            r = self._weight(self.r, "r_zr", lines, lambda a: _transposed(a)[..., : 2 * h],
                             lambda e: f"{_transposed_expr(e)}.narrow(-1, 0, {2 * h})")
            r_h = self._weight(self.r, "r_h", lines, lambda a: _transposed(a)[..., 2 * h :],
                               lambda e: f"{_transposed_expr(e)}.narrow(-1, {2 * h}, {h})")
        else:
            r = self._weight(self.r, "r", lines, _transposed, _transposed_expr)
        b_in = None
        if self.b.present and self.op == "GRU" and self.linear_before_reset:
            # The reset gate scales the hidden product with its bias: that bias stays apart.
            b_in = self._weight(self.b, "b_in", lines, lambda a: a[:, None, :width],
                                lambda e: f"{_columns(e, 0, width)}.unsqueeze_dim(1)")
            b_hidden = self._weight(self.b, "b_hidden", lines, lambda a: a[:, None, width:],
                                    lambda e: f"{_columns(e, width, width)}.unsqueeze_dim(1)")
        elif self.b.present:
            # Everywhere else the two biases simply add up.
            b_in = self._weight(self.b, "b", lines,
                                lambda a: (a[:, :width] + a[:, width:])[:, None, :],
                                lambda e: f"({_columns(e, 0, width)} + "
                                          f"{_columns(e, width, width)}).unsqueeze_dim(1)")
        if self.p.present:
            p = self._weight(self.p, "p", lines, lambda a: a[:, None, :],
                             lambda e: f"{e}.unsqueeze_dim(1)")
            peep = (self.node.tmp("p_i"), self.node.tmp("p_o"), self.node.tmp("p_f"))
            lines.append(f"{', '.join(peep)} = {p}.split({h}, -1)")
        return _Weights(w, r, r_h, b_in, b_hidden, peep)

    def _lengths(self, lines: list[str], xt: str, seq: Size, batch: Size) -> tuple[str, str]:
        """Locals for ``sequence_lens``: the (bool) mask of the valid steps
        ``[seq, 1, batch, 1]`` and, for a reverse direction, the order that reads each
        entry backwards."""
        t = self.node.tmp
        lens, steps, valid, mask, order = t("lens"), t("steps"), t("valid"), t("mask"), ""
        lines += [
            f'{lens} = {self.lens.expr}.cast("i64").unsqueeze_dim(0)',
            f"{steps} = Tensor.arange({seq}, device={xt}.device).unsqueeze_dim(1)",
            f"{valid} = {steps}.lower({lens})",
            f"{mask} = {valid}.reshape([{seq}, 1, {batch}, 1])",
        ]
        if self.direction != "forward":
            # Step t of an entry of length n read backwards is step n - 1 - t; the padding
            # steps stay where they are.
            order = t("order")
            lines += [
                f"{order} = ({lens} - 1 - {steps}).mask_where({valid}.bool_not(), "
                f"{steps}.expand([{seq}, {batch}]))",
                f"{order} = {order}.reshape([{seq}, 1, {batch}, 1])",
            ]
        return mask, order

    def as_loop(self) -> list[str]:
        node, h, t = self.node, self.hidden, self.node.tmp
        lines: list[str] = []
        weights = self._loop_weights(lines)
        # The sequence, time major, projected for every direction at once:
        # [seq, directions, batch, gates * hidden].
        xt = self.x.expr
        if self.layout:
            xt = t("x")
            lines.append(f"{xt} = {self.x.expr}.swap_dims(0, 1)")
        xp = t("xp")
        proj = f"{xt}.unsqueeze_dim(1).matmul({weights.w})"
        lines.append(f"{xp} = {proj} + {weights.b_in}" if weights.b_in else f"{xp} = {proj}")
        static = self.x.static_shape
        if static is None:
            seq, batch = f"{xt}.shape[0]", f"{xt}.shape[1]"
        else:
            seq, batch = static[:2][:: -1 if self.layout else 1]
        mask = order = ""
        if self.lens.present and not self._full_lengths(seq):
            mask, order = self._lengths(lines, xt, seq, batch)

        def backwards(value: str, size: int) -> str:
            """``value`` ([seq, 1, batch, size]) with each entry's steps reversed."""
            if not order:
                return f"{value}.flip([0])"
            return f"{value}.gather(0, {order}.expand([{seq}, 1, {batch}, {size}]))"

        def reverse_direction(value: str, size: int) -> str | None:
            if self.direction == "reverse":
                return f"{value} = {backwards(value, size)}"
            if self.direction == "bidirectional":
                second = backwards(f"{value}.narrow(1, 1, 1)", size)
                return f"{value} = Tensor.cat([{value}.narrow(1, 0, 1), {second}], 1)"
            return None

        if line := reverse_direction(xp, self.gates * h):
            lines.append(line)
        # The states: [1, directions, batch, hidden].
        state_h, state_c = t("h"), t("c")
        states = [(self.h0, state_h)] + ([(self.c0, state_c)] if self.op == "LSTM" else [])
        for value, name in states:
            if value.present:
                source = f"{value.expr}.swap_dims(0, 1)" if self.layout else value.expr
                lines.append(f"{name} = {source}.unsqueeze_dim(0)")
            else:
                lines.append(f"{name} = Tensor.zeros([1, {self.directions}, {batch}, {h}], "
                             f"{xt}.device, dtype={xt}.dtype)")
        outputs, x_t, m_t = t("ys"), t("x_t"), t("valid_t")
        lines.append(f"{outputs} = []")
        if not mask:
            lines.append(f"for {x_t} in {xp}.split(1, 0):")
            # Every step is valid: the step writes the state directly.
            step = _Step(x_t, state_h, state_c, state_h, state_c, weights)
        else:
            lines.append(f"for {x_t}, {m_t} in zip({xp}.split(1, 0), {mask}.split(1, 0)):")
            step = _Step(x_t, state_h, state_c, t("h_new"), t("c_new"), weights)
        steps = {"LSTM": self._lstm_step, "GRU": self._gru_step, "RNN": self._rnn_step}
        body = steps[self.op](step)
        if not mask:
            body.append(f"{outputs}.append({state_h})")
        else:
            # Past an entry's length, its state stays and its output is zero.
            body.append(f"{state_h} = {state_h}.mask_where({m_t}, {step.new_h})")
            if self.op == "LSTM":
                body.append(f"{state_c} = {state_c}.mask_where({m_t}, {step.new_c})")
            body.append(f"{outputs}.append({step.new_h}.mask_fill({m_t}.bool_not(), 0.0))")
        lines += [f"    {line}" for line in body]
        y = node.outputs[0]
        lines.append(f"{y} = Tensor.cat({outputs}, 0)")
        if line := reverse_direction(y, h):
            lines.append(line)
        if self.layout:
            lines.append(f"{y} = {y}.permute([2, 0, 1, 3])")
        for out, (_, value) in zip(node.outputs[1:], states):
            final = f"{value}.squeeze(0)"
            lines.append(f"{out} = {final}.swap_dims(0, 1)" if self.layout else f"{out} = {final}")
        return lines

    def _seq(self) -> Size | None:
        """The static sequence length, if known."""
        static = self.x.static_shape
        return None if static is None else static[1 if self.layout else 0]

    def _full_lengths(self, seq: Size | None) -> bool:
        """Whether constant sequence lengths all equal the (static) sequence length."""
        lens = self.lens.const
        return lens is not None and isinstance(seq, int) and bool(np.all(lens == seq))

    def _act(self, index: int, x: str) -> str:
        act, alpha, beta = self.activations[index]
        if self.clip is not None:
            bound = float(self.clip)
            x = f"({x}).clamp({literal(-bound)}, {literal(bound)})"
        return _apply(act.template, x, alpha, beta)

    def _lstm_step(self, s: _Step) -> list[str]:
        t, size = self.node.tmp, self.hidden
        gates, gi, go, gf, gc = t("gates"), t("gi"), t("go"), t("gf"), t("gc")
        i, f, o = t("i"), t("f"), t("o")
        body = [f"{gates} = {s.x_t} + {s.h}.matmul({s.weights.r})",
                f"{gi}, {go}, {gf}, {gc} = {gates}.split({size}, -1)"]  # fmt: skip
        gate_o = go
        if s.weights.peep is not None:
            pi, po, pf = s.weights.peep
            gi, gf = f"{gi} + {pi} * {s.c}", f"{gf} + {pf} * {s.c}"
            gate_o = f"{go} + {po} * {s.new_c}"  # the output gate sees the new cell
        body.append(f"{i} = {self._act(0, gi)}")
        if self.input_forget:
            body.append(f"{f} = 1.0 - {i}")  # the forget gate coupled to the input gate
        else:
            body.append(f"{f} = {self._act(0, gf)}")
        body += [
            f"{s.new_c} = {f} * {s.c} + {i} * {self._act(1, gc)}",
            f"{o} = {self._act(0, gate_o)}",
            f"{s.new_h} = {o} * {self._act(2, s.new_c)}",
        ]
        return body

    def _gru_step(self, s: _Step) -> list[str]:
        t, size = self.node.tmp, self.hidden
        xz, xr, xh, hz, hr = t("xz"), t("xr"), t("xh"), t("hz"), t("hr")
        z, reset, cand = t("z"), t("r"), t("n")
        body = [f"{xz}, {xr}, {xh} = {s.x_t}.split({size}, -1)"]
        if s.weights.r_h is None:  # linear_before_reset: the reset gate scales R_h h + Rb_h
            hp, hh = t("hp"), t("hh")
            product = f"{s.h}.matmul({s.weights.r})"
            if s.weights.b_hidden:
                product += f" + {s.weights.b_hidden}"
            body += [f"{hp} = {product}", f"{hz}, {hr}, {hh} = {hp}.split({size}, -1)"]
            candidate = f"{xh} + {reset} * {hh}"
        else:
            body.append(f"{hz}, {hr} = {s.h}.matmul({s.weights.r}).split({size}, -1)")
            candidate = f"{xh} + ({reset} * {s.h}).matmul({s.weights.r_h})"
        body += [
            f"{z} = {self._act(0, f'{xz} + {hz}')}",
            f"{reset} = {self._act(0, f'{xr} + {hr}')}",
            f"{cand} = {self._act(1, candidate)}",
            f"{s.new_h} = {cand} + {z} * ({s.h} - {cand})",  # (1 - z) * n + z * h
        ]
        return body

    def _rnn_step(self, s: _Step) -> list[str]:
        return [f"{s.new_h} = {self._act(0, f'{s.x_t} + {s.h}.matmul({s.weights.r})')}"]


def _recurrent(node: NodeContext) -> list[str]:
    rnn = _Recurrent(node)
    return rnn.as_layer() if rnn.fits_layer() else rnn.as_loop()


_LIMITS = "both directions must use the same activations; a sequence of length 0 fails"

# One converter serves every opset: later versions only add attributes (linear_before_reset
# from 3, layout from 14) and drop opset 1's output_sequence, which changes no value.
for _op in ("LSTM", "GRU", "RNN"):
    _attrs = (*_COMMON_ATTRS, *_EXTRA_ATTRS[_op], "layout", "output_sequence")
    converter(_op, since=1, attrs=_attrs, limits=_LIMITS)(_recurrent)
