"""The one feature store: an HDF5 file per (dataset, backbone, split).

Layout (``LAYOUT_VERSION`` 1)::

    features     (N, R, F) float32 | float16   per-image local features (regions or grid cells), zero-padded
    num_regions  (N,)      int32               valid rows of ``features`` per image (adaptive 10-100 boxes)
    image_ids    (N,)      utf-8 str           the dataset's image ids, in the split's order
    boxes        (N, R, 4) float32  optional   x1, y1, x2, y2 in original-image pixels (region features)
    image_wh     (N, 2)    int32    optional   original image width, height in pixels
    attrs: layout_version, backbone, weights_sha256, input_size, dataset, split, dtype, xmr_version, created
           (+ optional: backbone_key, backbone_config (JSON), resize, source, source_format)

``image_wh`` and the optional attrs were added without changing the version: readers ignore what they do
not know, and every file written before them is still valid.

Writing is resumable: each finished batch is an ``.npz`` shard (written atomically) under ``<out>.parts/``;
a restarted run skips the shards present, and the final file is assembled into a temporary file that is
renamed into place, so ``<out>`` is either complete or absent. A shard may carry explicit target ``rows``
(importers write records in their source order, not the split's); assembly checks that every row is
written exactly once.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from xmr import __version__
from xmr.core.errors import XmrError
from xmr.core.io import atomic_path, remove_stale_temps

LAYOUT_VERSION = 1
_SHARD_NAME = re.compile(r"^(\d+)\.npz$")


class ShardWriter:
    """Collects batches of features as atomic shards, then assembles the HDF5 file.

    ``num_images=None`` means "as many as the shards hold" (an importer that does not know the count up
    front); the shards must then cover rows ``0..N-1`` and carry their ``image_ids``.
    """

    def __init__(self, out: str | os.PathLike, num_images: int | None, attrs: dict[str, Any]) -> None:
        self.out = Path(out)
        self.num_images = num_images
        self.attrs = {k: v for k, v in attrs.items() if v is not None}
        self.parts = self.out.with_name(self.out.name + ".parts")
        self.parts.mkdir(parents=True, exist_ok=True)
        # a process killed inside atomic_path leaves its hidden temporary file behind; it is never a shard
        for stale in self.parts.glob(".*"):
            if stale.is_file():
                stale.unlink()
        # ... and one killed while assembling leaves atomic_path's temporary store beside ``out``
        remove_stale_temps(self.out)
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

    def abandon(self) -> None:
        """After a failed run: remove the parts folder when it holds no finished shard (only the settings
        stamp); finished shards stay, so that a rerun resumes."""
        if self.parts.exists() and not self.shards():
            shutil.rmtree(self.parts, ignore_errors=True)

    def _shard(self, start: int) -> Path:
        return self.parts / f"{start:09d}.npz"

    def done(self, start: int) -> bool:
        return self._shard(start).exists()

    def shards(self) -> list[Path]:
        """Finished shards, in key order (temporary files and the settings stamp excluded)."""
        found = [(int(m.group(1)), p) for p in self.parts.iterdir() if (m := _SHARD_NAME.match(p.name))]
        return [p for _, p in sorted(found)]

    def write(self, start: int, features: np.ndarray, num_regions: np.ndarray, boxes: np.ndarray | None = None,
              rows: np.ndarray | None = None, image_wh: np.ndarray | None = None,
              image_ids: list[str] | None = None) -> None:
        """Write one shard keyed by ``start``. ``rows`` are the target rows (default ``start, start+1, ...``)."""
        n = len(features)
        arrays: dict[str, np.ndarray] = {
            "features": features,
            "num_regions": np.asarray(num_regions, dtype=np.int32),
            "rows": np.arange(start, start + n, dtype=np.int64) if rows is None else np.asarray(rows, np.int64),
        }
        if len(arrays["num_regions"]) != n or len(arrays["rows"]) != n:
            raise ValueError("features, num_regions and rows must have the same length")
        if boxes is not None:
            arrays["boxes"] = np.asarray(boxes, dtype=np.float32)
        if image_wh is not None:
            arrays["image_wh"] = np.asarray(image_wh, dtype=np.int32)
        if image_ids is not None:
            arrays["image_ids"] = np.asarray(image_ids, dtype=str)
        with atomic_path(self._shard(start), ".npz") as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)

    def finish(self, image_ids: list[str] | None = None, dtype: str = "float32") -> Path:
        """Assemble the shards into ``out`` (atomically) and delete the parts folder."""
        import h5py

        shards = self.shards()
        if not shards:
            raise XmrError(f"{self.parts}: no feature shards to assemble")
        meta = []
        for p in shards:
            with np.load(p) as z:
                if "rows" in z:
                    rows = z["rows"]
                else:  # shards written before explicit rows existed: contiguous from the key
                    start = int(_SHARD_NAME.match(p.name).group(1))
                    rows = np.arange(start, start + len(z["num_regions"]))
                meta.append((p, rows, z["features"].shape, "boxes" in z, "image_wh" in z,
                             z["image_ids"].tolist() if "image_ids" in z else None))
        count = sum(len(rows) for _, rows, *_ in meta)
        n = self.num_images if self.num_images is not None else count
        seen = np.zeros(n, dtype=np.int32)
        for p, rows, *_ in meta:
            if len(rows) and (rows.min() < 0 or rows.max() >= n):
                raise XmrError(f"{p}: rows outside 0..{n - 1}; delete {self.parts} and start over")
            np.add.at(seen, rows, 1)
        if (seen > 1).any():
            raise XmrError(f"{self.parts}: row {int(np.argmax(seen > 1))} was written {int(seen.max())} times "
                           f"(duplicate images); delete that folder and start over")
        if (seen == 0).any():
            raise XmrError(f"{self.parts}: shards hold {count} images, expected {n} "
                           f"(first missing row {int(np.argmax(seen == 0))})")
        dims = {shape[2] for _, _, shape, *_ in meta}
        if len(dims) != 1:
            raise XmrError(f"{self.parts}: shards have different feature sizes {sorted(dims)}")
        feat_dim = dims.pop()
        max_r = max(shape[1] for _, _, shape, *_ in meta)
        has_boxes = all(m[3] for m in meta)
        has_wh = all(m[4] for m in meta)
        if image_ids is None:
            if any(m[5] is None for m in meta):
                raise XmrError(f"{self.parts}: image ids were neither given nor stored in the shards")
            ids = [""] * n
            for _, rows, _, _, _, shard_ids in meta:
                for r, i in zip(rows.tolist(), shard_ids):
                    ids[r] = i
            image_ids = ids
        if len(image_ids) != n:
            raise XmrError(f"{self.parts}: {len(image_ids)} image ids for {n} images")
        with atomic_path(self.out, ".h5") as tmp:
            with h5py.File(tmp, "w") as f:
                feats = f.create_dataset("features", (n, max_r, feat_dim), dtype=dtype,
                                         chunks=(1, max_r, feat_dim))
                nreg = f.create_dataset("num_regions", (n,), dtype="int32")
                bx = f.create_dataset("boxes", (n, max_r, 4), dtype="float32") if has_boxes else None
                wh = f.create_dataset("image_wh", (n, 2), dtype="int32") if has_wh else None
                for p, rows, shape, *_ in meta:
                    with np.load(p) as z:
                        b, r = shape[0], shape[1]
                        block = np.zeros((b, max_r, feat_dim), dtype=dtype)
                        block[:, :r] = z["features"]
                        boxes = None
                        if bx is not None:
                            boxes = np.zeros((b, max_r, 4), np.float32)
                            boxes[:, :r] = z["boxes"]
                        _put(feats, rows, block)
                        _put(nreg, rows, z["num_regions"])
                        if boxes is not None:
                            _put(bx, rows, boxes)
                        if wh is not None:
                            _put(wh, rows, z["image_wh"])
                f.create_dataset("image_ids", data=np.asarray(image_ids, dtype=object),
                                 dtype=h5py.string_dtype("utf-8"))
                f.attrs.update(self.attrs)
                f.attrs["layout_version"] = LAYOUT_VERSION
                f.attrs["dtype"] = dtype
                f.attrs["xmr_version"] = __version__
                f.attrs["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        shutil.rmtree(self.parts)
        return self.out


def _put(dataset, rows: np.ndarray, values: np.ndarray) -> None:
    """``dataset[rows] = values`` for any row order: a slice when contiguous, else sorted fancy indexing."""
    if len(rows) == 0:
        return
    if np.array_equal(rows, np.arange(rows[0], rows[0] + len(rows))):
        dataset[int(rows[0]): int(rows[0]) + len(rows)] = values
        return
    order = np.argsort(rows, kind="stable")
    dataset[rows[order].tolist()] = values[order]  # h5py needs increasing indices


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
                self.has_image_wh = "image_wh" in f
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

    def rows(self, indices: np.ndarray, regions: int | None = None) -> np.ndarray:
        """Rows ``indices`` (any order, repeats allowed), first ``regions`` regions, in the stored dtype, as one
        array. In RAM: one fancy index. HDF5: one read per distinct row, in file order, into one buffer (an h5py
        point selection of the whole batch was 70x slower than these per-row reads of one-image chunks)."""
        idx = np.asarray(indices, dtype=np.int64)
        cut = slice(None) if regions is None else slice(0, regions)
        if self._mem is not None:
            return self._mem[idx, cut]
        if self._h5 is None:
            import h5py

            self._h5 = h5py.File(self.path, "r")
        ds = self._h5["features"]
        uniq, inverse = np.unique(idx, return_inverse=True)
        r = ds.shape[1] if regions is None else min(regions, ds.shape[1])
        out = np.empty((len(uniq), r, ds.shape[2]), dtype=ds.dtype)
        for k, i in enumerate(uniq.tolist()):
            out[k] = ds[i, cut]
        return out[inverse]

    def boxes(self) -> np.ndarray | None:
        """(N, R, 4) boxes in original-image pixels, or None for grid features."""
        import h5py

        if not self.has_boxes:
            return None
        with h5py.File(self.path, "r") as f:
            return f["boxes"][:]

    def image_sizes(self) -> np.ndarray | None:
        """(N, 2) original image (width, height), or None when the file does not record them."""
        import h5py

        if not self.has_image_wh:
            return None
        with h5py.File(self.path, "r") as f:
            return f["image_wh"][:]

    def __getstate__(self) -> dict:  # h5py handles do not pickle into DataLoader workers
        state = dict(self.__dict__)
        state["_h5"] = None
        return state
