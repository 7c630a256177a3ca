"""The one feature store: an HDF5 file per (dataset, backbone, split).

Layout (``LAYOUT_VERSION`` 1)::

    features     (N, R, F) float32 | float16   per-image local features (regions or grid cells), zero-padded
    num_regions  (N,)      int32               valid rows of ``features`` per image (adaptive 10-100 boxes)
    image_ids    (N,)      utf-8 str           the dataset's image ids, in the split's order
    boxes        (N, R, 4) float32  optional   x1, y1, x2, y2 in original-image pixels
    attrs: layout_version, backbone, weights_sha256, input_size, dataset, split, dtype, xmr_version, created

Writing is resumable: each finished batch is an ``.npz`` shard (written atomically) under ``<out>.parts/``;
a restarted run skips the shards present, and the final file is assembled into a temporary file that is
renamed into place, so ``<out>`` is either complete or absent.
"""

from __future__ import annotations

import datetime as _dt
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from xmr import __version__
from xmr.errors import XmrError
from xmr.io import atomic_path

LAYOUT_VERSION = 1


class ShardWriter:
    """Collects batches of features as atomic shards, then assembles the HDF5 file."""

    def __init__(self, out: str | os.PathLike, num_images: int, attrs: dict[str, Any]) -> None:
        self.out = Path(out)
        self.num_images = num_images
        self.attrs = {k: v for k, v in attrs.items() if v is not None}
        self.parts = self.out.with_name(self.out.name + ".parts")
        self.parts.mkdir(parents=True, exist_ok=True)
        stamp = self.parts / "attrs.npz"
        if stamp.exists():  # a resumed run must extract with the same settings, or shards would mix
            old = {k: str(v) for k, v in np.load(stamp).items()}
            new = {k: str(v) for k, v in self.attrs.items()}
            if old != new:
                raise XmrError(
                    f"{self.parts}: partial extraction was made with different settings "
                    f"({sorted(set(old.items()) ^ set(new.items()))}); delete that folder to start over"
                )
        else:
            with atomic_path(stamp, ".npz") as tmp:
                with open(tmp, "wb") as f:
                    np.savez(f, **{k: np.asarray(str(v)) for k, v in self.attrs.items()})

    def _shard(self, start: int) -> Path:
        return self.parts / f"{start:09d}.npz"

    def done(self, start: int) -> bool:
        return self._shard(start).exists()

    def write(self, start: int, features: np.ndarray, num_regions: np.ndarray, boxes: np.ndarray | None) -> None:
        arrays = {"features": features, "num_regions": num_regions.astype(np.int32)}
        if boxes is not None:
            arrays["boxes"] = boxes.astype(np.float32)
        with atomic_path(self._shard(start), ".npz") as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)

    def finish(self, image_ids: list[str], dtype: str = "float32") -> Path:
        import h5py

        shards = sorted(p for p in self.parts.glob("*.npz") if p.name != "attrs.npz")
        loaded = [np.load(p) for p in shards]
        count = sum(len(z["num_regions"]) for z in loaded)
        if count != self.num_images:
            raise XmrError(f"{self.parts}: shards hold {count} images, expected {self.num_images}")
        max_r = max(z["features"].shape[1] for z in loaded)
        feat_dim = loaded[0]["features"].shape[2]
        has_boxes = "boxes" in loaded[0]
        with atomic_path(self.out, ".h5") as tmp:
            with h5py.File(tmp, "w") as f:
                feats = f.create_dataset("features", (count, max_r, feat_dim), dtype=dtype,
                                         chunks=(1, max_r, feat_dim))
                nreg = f.create_dataset("num_regions", (count,), dtype="int32")
                bx = f.create_dataset("boxes", (count, max_r, 4), dtype="float32") if has_boxes else None
                i = 0
                for z in loaded:
                    x = z["features"]
                    b = len(x)
                    block = np.zeros((b, max_r, feat_dim), dtype=dtype)
                    block[:, : x.shape[1]] = x
                    feats[i : i + b] = block
                    nreg[i : i + b] = z["num_regions"]
                    if bx is not None:
                        bb = np.zeros((b, max_r, 4), np.float32)
                        bb[:, : x.shape[1]] = z["boxes"]
                        bx[i : i + b] = bb
                    i += b
                f.create_dataset("image_ids", data=np.asarray(image_ids, dtype=object),
                                 dtype=h5py.string_dtype("utf-8"))
                f.attrs.update(self.attrs)
                f.attrs["layout_version"] = LAYOUT_VERSION
                f.attrs["dtype"] = dtype
                f.attrs["xmr_version"] = __version__
                f.attrs["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        shutil.rmtree(self.parts)
        return self.out


class FeatureFile:
    """Read access to a feature file; opens the HDF5 handle lazily (one per DataLoader worker process)."""

    def __init__(self, path: str | os.PathLike, in_memory: bool | None = None) -> None:
        import h5py

        self.path = Path(path)
        if not self.path.exists():
            raise XmrError(f"{self.path}: feature file not found; run `xmr extract` (or the Snakemake rule "
                           f"`extract`) for this dataset/backbone/split first")
        try:
            with h5py.File(self.path, "r") as f:
                for key in ("features", "num_regions", "image_ids"):
                    if key not in f:
                        raise XmrError(f"{self.path}: not an xmr feature file (no '{key}' dataset)")
                self.shape = tuple(f["features"].shape)
                self.attrs = {k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()}
                self.image_ids = [s.decode() if isinstance(s, bytes) else str(s) for s in f["image_ids"][:]]
                self.num_regions = f["num_regions"][:]
                self.has_boxes = "boxes" in f
                nbytes = int(np.prod(self.shape)) * f["features"].dtype.itemsize
        except OSError as e:
            raise XmrError(f"{self.path}: cannot read HDF5 ({e}); delete it and re-extract") from None
        if in_memory is None:
            in_memory = nbytes < 4 * 2**30
        self._mem: np.ndarray | None = None
        self._h5 = None
        if in_memory:
            with h5py.File(self.path, "r") as f:
                self._mem = f["features"][:]

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def feature_dim(self) -> int:
        return self.shape[2]

    def __getitem__(self, i: int) -> np.ndarray:
        if self._mem is not None:
            return self._mem[i]
        if self._h5 is None:
            import h5py

            self._h5 = h5py.File(self.path, "r")
        return self._h5["features"][i]

    def boxes(self) -> np.ndarray | None:
        import h5py

        if not self.has_boxes:
            return None
        with h5py.File(self.path, "r") as f:
            return f["boxes"][:]

    def __getstate__(self) -> dict:  # h5py handles do not pickle into DataLoader workers
        state = dict(self.__dict__)
        state["_h5"] = None
        return state
