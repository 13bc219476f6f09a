"""Data for training: datasets, their transforms, and the loaders that batch them."""

from ember.data.dataloader import Batcher, DataLoader, DataLoaderBuilder, DataLoaderWorkerError
from ember.data.dataset import (
    ComposedDataset,
    Dataset,
    DatasetError,
    DatasetFileNotFoundError,
    HuggingfaceDatasetLoader,
    InMemDataset,
    MapperDataset,
    MissingDependencyError,
    PartialDataset,
    SamplerDataset,
    ShuffledDataset,
    SqliteDataset,
    SqliteDatasetStorage,
    SqliteDatasetWriter,
    WindowsDataset,
)
from ember.data.vision import ImageFolderDataset, ImageFolderItem, MnistDataset, MnistItem

__all__ = [
    "Batcher",
    "ComposedDataset",
    "DataLoader",
    "DataLoaderBuilder",
    "DataLoaderWorkerError",
    "Dataset",
    "DatasetError",
    "DatasetFileNotFoundError",
    "HuggingfaceDatasetLoader",
    "ImageFolderDataset",
    "ImageFolderItem",
    "InMemDataset",
    "MapperDataset",
    "MissingDependencyError",
    "MnistDataset",
    "MnistItem",
    "PartialDataset",
    "SamplerDataset",
    "ShuffledDataset",
    "SqliteDataset",
    "SqliteDatasetStorage",
    "SqliteDatasetWriter",
    "WindowsDataset",
]
