"""Data loading: the Batcher protocol, the DataLoader and its builder."""

from ember.data.dataloader.batcher import Batcher
from ember.data.dataloader.builder import DataLoaderBuilder
from ember.data.dataloader.loader import DataLoader
from ember.data.dataloader.worker_error import DataLoaderWorkerError

__all__ = ["Batcher", "DataLoader", "DataLoaderBuilder", "DataLoaderWorkerError"]
