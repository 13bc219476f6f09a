"""Classifies test digits with the model ``train.py`` saved (the book's "Inference").

Run: ``.venv/bin/python examples/guide/infer.py`` (the same as ``ember guide infer``).
"""

import ember
from ember.data.vision.mnist import MnistDataset
from ember.guide.inference import infer

if __name__ == "__main__":
    device = ember.device("ndarray")  # inference needs no gradients
    infer("/tmp/guide", device, MnistDataset.test()[42])  # one digit, as in the book
    infer("/tmp/guide", device, count=10)  # the first ten test digits
