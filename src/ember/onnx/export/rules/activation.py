"""Activations with an ONNX node of their own. The others (``gelu`` before opset 20,
``softplus``, ``mish`` before 18, ``log_sigmoid``, ``prelu``, ``glu``, ``softmin``,
``quiet_softmax``) have no exporter at that opset, so the tracer records their primitives."""

from __future__ import annotations

from ember.onnx.export.emitter import Emitter
from ember.onnx.export.registry import exporter
from ember.onnx.export.tracer import OpCall

ONE_NODE = {"relu": "Relu", "sigmoid": "Sigmoid"}
SELU_ALPHA, SELU_SCALE = 1.6732632423543772, 1.0507009873554805


@exporter("relu", "sigmoid")
def one_node(e: Emitter, call: OpCall) -> None:
    e.node(ONE_NODE[call.op.name], [e.input(call, 0)], [e.output(call)])


@exporter("relu6")
def relu6(e: Emitter, call: OpCall) -> None:
    low, high = e.scalar_like(call, 0.0), e.scalar_like(call, 6.0)
    e.node("Clip", [e.input(call, 0), low, high], [e.output(call)])


@exporter("hard_sigmoid")
def hard_sigmoid(e: Emitter, call: OpCall) -> None:
    e.node("HardSigmoid", [e.input(call, 0)], [e.output(call)], alpha=1.0 / 6.0, beta=0.5)


@exporter("hard_swish", since=14)
def hard_swish(e: Emitter, call: OpCall) -> None:
    e.node("HardSwish", [e.input(call, 0)], [e.output(call)])


@exporter("silu")
def silu(e: Emitter, call: OpCall) -> None:
    x = e.input(call, 0)
    e.node("Mul", [x, e.node("Sigmoid", [x])], [e.output(call)])


@exporter("leaky_relu")
def leaky_relu(e: Emitter, call: OpCall) -> None:
    e.node("LeakyRelu", [e.input(call, 0)], [e.output(call)],
           alpha=float(e.static(call, "negative_slope")))  # fmt: skip


@exporter("elu", "celu")
def elu(e: Emitter, call: OpCall) -> None:
    op_type = "Elu" if call.op.name == "elu" else "Celu"
    e.node(op_type, [e.input(call, 0)], [e.output(call)], alpha=float(e.static(call, "alpha")))


@exporter("selu")
def selu(e: Emitter, call: OpCall) -> None:
    e.node("Selu", [e.input(call, 0)], [e.output(call)], alpha=SELU_ALPHA, gamma=SELU_SCALE)


@exporter("mish", since=18)
def mish(e: Emitter, call: OpCall) -> None:
    e.node("Mish", [e.input(call, 0)], [e.output(call)])


@exporter("gelu", "gelu_tanh", since=20)
def gelu(e: Emitter, call: OpCall) -> None:
    approximate = "tanh" if call.op.name == "gelu_tanh" else "none"
    e.node("Gelu", [e.input(call, 0)], [e.output(call)], approximate=approximate)


@exporter("softmax", "log_softmax", since=13)
def softmax(e: Emitter, call: OpCall) -> None:
    """Softmax along one dim (opset 13 made ONNX's ``axis`` mean exactly that)."""
    op_type = "Softmax" if call.op.name == "softmax" else "LogSoftmax"
    e.node(op_type, [e.input(call, 0)], [e.output(call)], axis=e.static(call, "dim"))
