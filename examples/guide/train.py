"""Trains the guide's model on MNIST with the learner (the book's "Training" and "Backend").

The backend is chosen here, at the entry point: the model, data and training code in
``ember.guide`` run unchanged on any device. Use ``ember.device("torch")`` for
PyTorch on the CPU, ``ember.device("torch", "cuda:0")`` for a GPU.

Run: ``.venv/bin/python examples/guide/train.py`` (the same as ``ember guide train``).
"""

import ember
from ember.guide.training import default_config, train

if __name__ == "__main__":
    device = ember.device("ndarray").autodiff()  # NumPy on the CPU, with gradients
    config = default_config()  # ModelConfig(10, 512), AdamConfig(), 10 epochs of 64 digits
    train("/tmp/guide", config, device)
