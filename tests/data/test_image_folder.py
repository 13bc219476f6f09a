"""ImageFolderDataset: classes from folder names, items, and errors that name the path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ember.backend.errors import ArgumentError
from ember.data.dataloader.batcher import Batcher
from ember.data.dataloader.builder import DataLoaderBuilder
from ember.data.dataset.base import DatasetError, DatasetFileNotFoundError
from ember.data.vision.image_folder import ImageFolderDataset


def save(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "images"
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4)
    save(root / "zebra" / "b.png", gray)
    save(root / "zebra" / "a.png", gray + 100)
    save(root / "ant" / "nested" / "deep.bmp", gray + 50)
    rgb = np.stack([gray, gray + 1, gray + 2], axis=-1)
    save(root / "moth" / "x.PNG", rgb)
    (root / "moth" / "notes.txt").write_text("not an image")
    save(root / ".hidden" / "skip.png", gray)
    save(root / "moth" / ".skip.png", gray)
    return root


def test_classes_sorted_and_items_labelled(tree):
    data = ImageFolderDataset(tree)
    assert data.classes == ["ant", "moth", "zebra"]
    assert [(path.name, label) for path, label in data.samples] == [
        ("deep.bmp", 0),
        ("x.PNG", 1),
        ("a.png", 2),
        ("b.png", 2),
    ]
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4)
    image, label = data[0]
    np.testing.assert_array_equal(image, gray + 50)
    assert label == 0
    assert data[1].image.shape == (3, 4, 3) and int(data[1].image[0, 0, 2]) == 2
    np.testing.assert_array_equal(data[-1].image, gray)
    assert data.get(4) is None and len(data) == 4


def test_mode_converts_every_image(tree):
    data = ImageFolderDataset(tree, mode="RGB")
    assert {item.image.shape for item in data} == {(3, 4, 3)}
    assert ImageFolderDataset(tree, mode="L")[1].image.shape == (3, 4)
    with pytest.raises(ArgumentError, match=r"mode must be a Pillow mode .* got 'rgb'"):
        ImageFolderDataset(tree, mode="rgb")


def test_extensions_filter(tree):
    data = ImageFolderDataset(tree, extensions=[".BMP"])
    assert [(path.name, label) for path, label in data.samples] == [("deep.bmp", 0)]


def test_loader_over_image_folder(tree):
    class Stack(Batcher):
        def batch(self, items, device):
            return np.stack([item.image for item in items]), [item.label for item in items]

    loader = (
        DataLoaderBuilder(Stack())
        .batch_size(2)
        .num_workers(2)
        .build(ImageFolderDataset(tree, mode="L"))
    )
    batches = list(loader)
    assert [labels for _, labels in batches] == [[0, 1], [2, 2]]
    assert batches[1][0].shape == (2, 3, 4)


def test_missing_root(tmp_path):
    with pytest.raises(DatasetFileNotFoundError) as error:
        ImageFolderDataset(tmp_path / "nowhere")
    assert f"{tmp_path / 'nowhere'} is not a folder" in str(error.value)


def test_empty_folder_names_the_path(tmp_path):
    with pytest.raises(DatasetError) as error:
        ImageFolderDataset(tmp_path)
    assert f"no images in {tmp_path}" in str(error.value)
    assert "found 0 sub-folders (none)" in str(error.value)
    (tmp_path / "cats").mkdir()
    (tmp_path / "cats" / "readme.txt").write_text("no images")
    with pytest.raises(DatasetError, match=r"found 1 sub-folders \(cats\)"):
        ImageFolderDataset(tmp_path)


def test_unreadable_image_names_the_path(tree):
    broken = tree / "zebra" / "c.png"
    broken.write_bytes(b"\x89PNG but not really")
    data = ImageFolderDataset(tree)
    assert data[2].label == 2  # the others still read
    with pytest.raises(DatasetError) as error:
        data[4]
    assert f"cannot read the image {broken}" in str(error.value)
    assert error.value.file == str(broken)
