"""Data for training: datasets, their transforms, and the loaders that batch them."""

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

__all__ = [
    "ComposedDataset",
    "Dataset",
    "DatasetError",
    "DatasetFileNotFoundError",
    "HuggingfaceDatasetLoader",
    "InMemDataset",
    "MapperDataset",
    "MissingDependencyError",
    "PartialDataset",
    "SamplerDataset",
    "ShuffledDataset",
    "SqliteDataset",
    "SqliteDatasetStorage",
    "SqliteDatasetWriter",
    "WindowsDataset",
]
