"""Trains the guide's model with a loop written out by hand (the book's "Custom Training Loop").

The loop itself is in ``src/ember/guide/custom_training_loop.py``: forward pass, loss,
``backward()``, ``GradientsParams``, one optimizer step per batch, then a validation
pass on ``model.valid()`` each epoch.

Run: ``.venv/bin/python examples/guide/custom_training_loop.py``
(the same as ``ember guide custom-loop``).
"""

import ember
from ember.guide.custom_training_loop import run
from ember.guide.training import default_config

if __name__ == "__main__":
    device = ember.device("ndarray").autodiff()
    run(default_config(), device, log_every=100)
