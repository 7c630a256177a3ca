"""The ``precomputed`` text encoder: caption features computed offline (HGLMM Fisher vectors, ...) and read
from ``{features_dir}/{split}.h5`` (layout: :func:`xmr.text.hglmm.write_text_features`).

The run config names the kind in ``features.text`` (e.g. ``hglmm``); the files then live in
``{features.dir}/{dataset}/{features.text}/`` unless ``text.features_dir`` says otherwise.
:meth:`xmr.methods.base.RetrievalModel.settings_of` resolves that (``TextInput.precomputed_dir``) into the
``text`` section handed to the encoder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from xmr.core.errors import XmrError
from xmr.models.text import TEXT_ENCODERS, TextEncoder

IN_MEMORY_BYTES = 4 * 2**30  # smaller files are read once into RAM; larger ones row by row from HDF5


class _SplitTable:
    """Caption rows of one split file: in memory when small, else read from HDF5 per batch."""

    def __init__(self, path: Path) -> None:
        import h5py

        if not path.exists():
            raise XmrError(f"{path}: text-feature file not found; run `xmr text-features` (Snakemake rule "
                           f"`text_features`) for this dataset and split")
        self.path = path
        try:
            with h5py.File(path, "r") as f:
                for key in ("features", "captions"):
                    if key not in f:
                        raise XmrError(f"{path}: not an xmr text-feature file (no '{key}' dataset)")
                self.shape = tuple(f["features"].shape)
                self.captions = [c.decode() if isinstance(c, bytes) else str(c) for c in f["captions"][:]]
                nbytes = int(np.prod(self.shape)) * f["features"].dtype.itemsize
                self.mem = f["features"][:] if nbytes < IN_MEMORY_BYTES else None
        except OSError as e:
            raise XmrError(f"{path}: cannot read HDF5 ({e}); delete it and recompute it") from None
        self._h5 = None

    def rows(self, indices: list[int]) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= self.shape[0]):
            raise XmrError(f"{self.path}: caption index {int(idx.max())} out of range ({self.shape[0]} captions); "
                           f"the file was computed for a different version of the split, recompute it")
        if self.mem is not None:
            return self.mem[idx]
        if self._h5 is None:
            import h5py

            self._h5 = h5py.File(self.path, "r")
        order = np.argsort(idx)  # h5py fancy indexing needs increasing, unique indices
        uniq, inverse = np.unique(idx[order], return_inverse=True)
        block = self._h5["features"][uniq]
        out = np.empty((len(idx), self.shape[1]), dtype=block.dtype)
        out[order] = block[inverse]
        return out


@TEXT_ENCODERS.register("precomputed")
class PrecomputedTextEncoder(TextEncoder):
    """Looks caption rows up by their index in the split; ``forward`` gives (B, 1, F) and lengths 1.

    ``collate`` checks that the stored caption text equals the batch's caption, so features computed for
    another version of the annotations are caught instead of silently misaligned.
    """

    def __init__(self, text_cfg: dict, embed_dim: int, vocab_words=None, seed: int = 0) -> None:
        super().__init__()
        where = text_cfg.get("features_dir")
        if not where:
            raise XmrError("text.features_dir: the precomputed text encoder needs the folder of {split}.h5 files "
                           "(set features.text, e.g. hglmm, or text.features_dir)")
        self.features_dir = Path(where)
        files = sorted(self.features_dir.glob("*.h5"))
        if not files:
            raise XmrError(f"{self.features_dir}: no text-feature files (*.h5); run `xmr text-features` first")
        import h5py

        with h5py.File(files[0], "r") as f:
            if "features" not in f:
                raise XmrError(f"{files[0]}: not an xmr text-feature file (no 'features' dataset)")
            self.out_dim = int(f["features"].shape[1])
            self.source = {k: (v.item() if hasattr(v, "item") else v) for k, v in f.attrs.items()}
        self._tables: dict[str, _SplitTable] = {}

    def table(self, split: str) -> _SplitTable:
        if split not in self._tables:
            t = _SplitTable(self.features_dir / f"{split}.h5")
            if t.shape[1] != self.out_dim:
                raise XmrError(f"{t.path}: {t.shape[1]}-d features, but the model was built for {self.out_dim}-d; "
                               f"recompute all splits with the same settings")
            self._tables[split] = t
        return self._tables[split]

    def collate(self, captions, tokens, indices=None, split=None):
        if indices is None or split is None:
            raise XmrError("precomputed text encoder: collate needs caption indices and the split name")
        t = self.table(split)
        rows = t.rows(indices)
        for c, j in zip(captions, indices):
            if t.captions[j] != c:
                raise XmrError(f"{t.path}: row {j} holds caption {t.captions[j]!r} but the split has {c!r}; "
                               f"the annotations changed since the features were computed, recompute them")
        return {"features": torch.from_numpy(np.asarray(rows, dtype=np.float32)),
                "lengths": torch.ones(len(indices), dtype=torch.long)}

    def forward(self, batch):
        x = batch["features"].float()
        return x.unsqueeze(1), batch["lengths"].to(x.device)

    def __getstate__(self) -> dict:  # DataLoader workers get the encoder by pickling: no h5py handles
        state = dict(self.__dict__)
        state["_tables"] = {}
        return state

