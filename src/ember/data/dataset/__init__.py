"""Datasets: the Dataset protocol, storages (in memory, SQLite), lazy transforms and
the Hugging Face importer."""

from ember.data.dataset.base import Dataset, DatasetError, DatasetFileNotFoundError
from ember.data.dataset.huggingface import (
    HuggingfaceDatasetLoader,
    MissingDependencyError,
    store_huggingface,
)
from ember.data.dataset.in_memory import InMemDataset
from ember.data.dataset.sqlite import SqliteDataset, SqliteDatasetStorage, SqliteDatasetWriter
from ember.data.dataset.transform.composed import ComposedDataset
from ember.data.dataset.transform.mapper import MapperDataset
from ember.data.dataset.transform.partial import PartialDataset
from ember.data.dataset.transform.sampler import SamplerDataset
from ember.data.dataset.transform.shuffled import ShuffledDataset
from ember.data.dataset.transform.window import WindowsDataset

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
    "store_huggingface",
]
