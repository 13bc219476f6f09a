"""Vision datasets: MNIST (IDX files) and ImageFolderDataset (one sub-folder per class)."""

from ember.data.vision.image_folder import ImageFolderDataset, ImageFolderItem
from ember.data.vision.mnist import MnistDataset, MnistItem

__all__ = ["ImageFolderDataset", "ImageFolderItem", "MnistDataset", "MnistItem"]
