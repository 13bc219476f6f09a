"""ImageFolderDataset: labelled images laid out as one sub-folder per class.

::

    root/
      cat/  0001.png  0002.jpg  ...
      dog/  a.png  more/b.png  ...

The classes are the sub-folders' names, sorted, and a class's label is its position
in that order (``cat`` 0, ``dog`` 1). Images are found at any depth below their class
folder; folders and files whose names start with a dot are skipped. Images are read
with Pillow when an item is asked for, not when the dataset is built.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ember.backend.errors import ArgumentError
from ember.data.dataset.base import Dataset, DatasetError, DatasetFileNotFoundError

IMAGE_EXTENSIONS: tuple[str, ...] = (
    ".bmp",
    ".gif",
    ".jpeg",
    ".jpg",
    ".png",
    ".tif",
    ".tiff",
    ".webp",
)
"""The file name endings read as images by default (compared in lower case)."""


class ImageFolderItem(NamedTuple):
    """One image as an array (``[H, W]`` for one channel, ``[H, W, C]`` otherwise) and its label."""

    image: np.ndarray
    label: int


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError as error:  # pragma: no cover - Pillow is a dependency
        raise ModuleNotFoundError(
            "ImageFolderDataset reads images with Pillow: pip install pillow"
        ) from error
    return Image


class ImageFolderDataset(Dataset[ImageFolderItem]):
    """The images below ``root``, labelled by the sub-folder (class) they are in.

    Args:
        root: the folder holding one sub-folder per class.
        mode: a Pillow mode to convert every image to (``"L"`` gray, ``"RGB"``, ...),
            so all items have the same number of channels. Default: None, each image
            keeps its own mode.
        extensions: the file name endings to read as images. Default: :data:`IMAGE_EXTENSIONS`.

    Raises:
        DatasetFileNotFoundError: ``root`` is not a folder.
        DatasetError: ``root`` holds no image in a class sub-folder; or, when an item is
            read, its file is not an image Pillow can read (the message names the file).

    Example:
        >>> import pathlib, tempfile
        >>> import numpy as np
        >>> from PIL import Image
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> for name, value in [("cat", 10), ("dog", 200)]:
        ...     (root / name).mkdir()
        ...     Image.fromarray(np.full([4, 6], value, np.uint8)).save(root / name / "0.png")
        >>> images = ImageFolderDataset(root)
        >>> images.classes, len(images)
        (['cat', 'dog'], 2)
        >>> image, label = images[1]
        >>> image.shape, int(image[0, 0]), label
        ((4, 6), 200, 1)
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        mode: str | None = None,
        extensions: Iterable[str] = IMAGE_EXTENSIONS,
    ) -> None:
        image_module = _pillow()
        if mode is not None and mode not in image_module.MODES:
            raise ArgumentError(
                f"ImageFolderDataset: mode must be a Pillow mode "
                f"({', '.join(image_module.MODES)}), "
                f"got {mode!r}"
            )
        self.root = Path(root)
        self.mode = mode
        if not self.root.is_dir():
            raise DatasetFileNotFoundError(
                f"ImageFolderDataset: {self.root} is not a folder", file=str(self.root)
            )
        endings = tuple(e.lower() for e in extensions)
        self.classes = sorted(
            p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")
        )
        self.samples: list[tuple[Path, int]] = [
            (path, label)
            for label, name in enumerate(self.classes)
            for path in _images_below(self.root / name, endings)
        ]
        if not self.samples:
            raise DatasetError(
                f"ImageFolderDataset: no images in {self.root}: expected one sub-folder per "
                f"class holding {'/'.join(endings)} files, found "
                f"{len(self.classes)} sub-folders ({', '.join(self.classes) or 'none'})",
                file=str(self.root),
            )

    def get(self, index: int) -> ImageFolderItem | None:
        if not 0 <= index < len(self.samples):
            return None
        path, label = self.samples[index]
        try:
            with _pillow().open(path) as image:
                converted = image.convert(self.mode) if self.mode is not None else image
                array = np.array(converted)
        except (OSError, ValueError) as error:  # UnidentifiedImageError is an OSError
            raise DatasetError(
                f"ImageFolderDataset: cannot read the image {path}: {error}", file=str(path)
            ) from None
        return ImageFolderItem(array, label)

    def __len__(self) -> int:
        return len(self.samples)

    def __repr__(self) -> str:
        root, classes = str(self.root), len(self.classes)
        return f"ImageFolderDataset(root={root!r}, classes={classes}, len={len(self)})"


def _images_below(folder: Path, endings: tuple[str, ...]) -> list[Path]:
    found = []
    for directory, subdirs, files in os.walk(folder):
        subdirs[:] = [d for d in subdirs if not d.startswith(".")]
        found.extend(
            Path(directory) / f
            for f in files
            if not f.startswith(".") and f.lower().endswith(endings)
        )
    return sorted(found)
