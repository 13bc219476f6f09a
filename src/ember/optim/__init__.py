"""Optimizers: module mappers that take a model and its gradients to the next model.

As in Burn, an optimizer does not hold the parameters it trains and never
mutates them. ``optimizer.step(lr, model, grads)`` returns a new model; the
learning rate is passed on every step (so any schedule can drive it), and the
gradients are consumed by the step: there is no ``zero_grad``.

One training step:

    >>> import ember
    >>> from ember import Tensor
    >>> from ember.nn.linear import LinearConfig
    >>> from ember.optim.adam import AdamConfig
    >>> from ember.optim.grads import GradientsParams
    >>> device = ember.device("ndarray").autodiff()
    >>> ember.seed(device, 0)  # an unlucky init (one in ~40) makes the first step overshoot
    >>> model = LinearConfig(3, 1).init(device)
    >>> optimizer = AdamConfig().init()
    >>> x, target = Tensor.ones([4, 3], device), Tensor.zeros([4, 1], device)
    >>> loss = ((model(x) - target) ** 2).mean()
    >>> grads = GradientsParams.from_grads(loss.backward(), model)
    >>> updated = optimizer.step(1e-2, model, grads)
    >>> updated.weight.id == model.weight.id, updated.weight.val().is_require_grad()
    (True, True)
    >>> bool(((updated(x) - target) ** 2).mean() < loss)
    True

``GradientsParams`` keys gradients by parameter id, so gradients from several
backward passes can be summed (``GradientsAccumulator``) or moved between
devices. Optimizer state (moments, step counts) is kept per parameter id and
saved like a module's record: ``optimizer.to_record()`` gives plain data that
every recorder in :mod:`ember.record` writes, and ``optimizer.load_record(record)``
restores it.

==================  ========================  =======================================
config              PyTorch                   Burn's defaults that differ from PyTorch's
==================  ========================  =======================================
``SgdConfig``       ``torch.optim.SGD``       ``MomentumConfig()``: dampening 0.1
``AdamConfig``      ``torch.optim.Adam``      epsilon 1e-5
``AdamWConfig``     ``torch.optim.AdamW``     epsilon 1e-5, weight_decay 1e-4
``RmsPropConfig``   ``torch.optim.RMSprop``   epsilon 1e-5
``AdaGradConfig``   ``torch.optim.Adagrad``   epsilon 1e-5
==================  ========================  =======================================

Gradient clipping (``GradientClippingConfig.Value`` / ``.Norm``) is set in each
config and clips every parameter's gradient on its own (Burn's rule).
"""

from ember.optim import lr_scheduler
from ember.optim.accumulator import GradientsAccumulator
from ember.optim.adagrad import AdaGrad, AdaGradConfig
from ember.optim.adam import Adam, AdamConfig
from ember.optim.adamw import AdamW, AdamWConfig
from ember.optim.clipping import GradientClippingConfig
from ember.optim.decay import WeightDecayConfig
from ember.optim.grads import GradientsParams
from ember.optim.momentum import MomentumConfig
from ember.optim.optimizer import Optimizer, OptimizerAdaptor, SimpleOptimizer
from ember.optim.rmsprop import RmsProp, RmsPropConfig
from ember.optim.sgd import Sgd, SgdConfig

__all__ = [
    "AdaGrad", "AdaGradConfig", "Adam", "AdamConfig", "AdamW", "AdamWConfig",
    "GradientClippingConfig", "GradientsAccumulator", "GradientsParams", "MomentumConfig",
    "Optimizer", "OptimizerAdaptor", "RmsProp", "RmsPropConfig", "Sgd", "SgdConfig",
    "SimpleOptimizer", "WeightDecayConfig", "lr_scheduler",
]  # fmt: skip
