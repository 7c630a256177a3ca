"""The in-memory form every dataset reader returns, and the reader registry."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from xmr.core.registry import Registry

#: ``reader(dataset_cfg: dict, split: str) -> CaptionedSplit``; one entry per on-disk format.
DATASET_READERS: Registry[Callable[[dict, str], "CaptionedSplit"]] = Registry("dataset format")


@dataclass
class CaptionedSplit:
    """One split of an image-caption dataset.

    Captions are ordered by image: caption ``j`` belongs to image ``caption_image[j]``. When every image has
    the same number ``c`` of captions, caption ``j`` belongs to image ``j // c`` (the evaluation protocol).
    """

    name: str
    split: str
    image_ids: list[str]
    image_paths: list[Path]
    captions: list[str]
    caption_image: np.ndarray
    tokens: list[list[str]] | None = None
    image_labels: np.ndarray | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: where each image is listed, ``<annotation file> <entry>`` (``images[3]``, ``line 7``), for error messages
    image_sources: list[str] | None = None

    @property
    def num_images(self) -> int:
        return len(self.image_ids)

    @property
    def num_captions(self) -> int:
        return len(self.captions)

    @property
    def captions_per_image(self) -> int | None:
        """``c`` if captions are exactly c per image in image order, else None."""
        n = self.num_images
        if n == 0 or self.num_captions % n:
            return None
        c = self.num_captions // n
        return c if np.array_equal(self.caption_image, np.arange(self.num_captions) // c) else None

    def require_images(self, without_images: str) -> None:
        """Raise :class:`XmrError` unless every image file of the split is on disk; ``without_images`` says what
        to do for a features-only dataset (one that lists no image files)."""
        from xmr.core.errors import XmrError

        if len(self.image_paths) != self.num_images:
            raise XmrError(f"dataset {self.name} split {self.split}: no image files (a features-only dataset); "
                           f"{without_images}")
        message = self.missing_images_message()
        if message:
            raise XmrError(message)

    def missing_images_message(self) -> str | None:
        """None when every listed image file is on disk, else one line naming the first missing file, where the
        annotation file lists it and what to do."""
        missing = [i for i, p in enumerate(self.image_paths) if not Path(p).exists()]
        if not missing:
            return None
        first = missing[0]
        listed = f"listed at {self.image_sources[first]}; " if self.image_sources else ""
        return (f"{self.image_paths[first]}: image not found ({listed}{len(missing)} of {self.num_images} images of "
                f"split {self.split} missing); put the file there, or correct that entry or `images:` in "
                f"config/datasets/{self.name}.yaml")

    @property
    def caption_labels(self) -> np.ndarray | None:
        return None if self.image_labels is None else self.image_labels[self.caption_image]


def images_folder(dataset_cfg: dict) -> Path:
    """The folder an annotation file's image paths are relative to: ``images:``, else the annotation file's own."""
    return Path(dataset_cfg.get("images") or Path(dataset_cfg["annotations"]).parent)


def load_split(dataset_cfg: dict, split: str) -> CaptionedSplit:
    """Read ``split`` of the dataset described by ``dataset_cfg`` (a validated ``config/datasets/*.yaml``)."""
    return DATASET_READERS.get(dataset_cfg["format"])(dataset_cfg, split)
