"""The one record of what a run reads for a split, besides its config and checkpoint: :class:`RunInputs`.

Three readers use it and so cannot disagree: the trainer's resume digest (a run never resumes onto inputs that
changed since its ``last.pt``), the gallery cache's key (:mod:`xmr.run.gallery_cache`) and the workflow's rule inputs
(:mod:`xmr.planning.workflow_inputs`), from the run's typed settings (:mod:`xmr.settings.run_settings`). Paths only:
no torch, no file reads except the digests.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from xmr.core.io import sha256_file
from xmr.settings.run_settings import RunSettings


def annotation_files(dataset_cfg: dict) -> list[Path]:
    """A dataset's annotation file(s) (its config's ``annotations``: one path, a list, or none)."""
    ann = dataset_cfg.get("annotations") or []
    return [Path(p) for p in ([ann] if isinstance(ann, str) else ann)]


@dataclass(frozen=True)
class RunInputs:
    """The files a run reads for ``split``: the image side (a feature file; end to end none, the images come
    through the backbone, whose weights the built model reports), the precomputed text features if the run uses
    them, and the dataset's annotation files."""

    split: str
    end_to_end: bool
    image_features: Path | None
    text_features: Path | None
    annotations: tuple[Path, ...]

    @classmethod
    def of(cls, settings: RunSettings, split: str) -> RunInputs:
        image, text = settings.image, None
        if settings.text.encoder == "precomputed":
            text = settings.text.required_features_dir(settings.name) / f"{split}.h5"
        return cls(split, image.end_to_end, None if image.end_to_end else image.feature_path(split), text,
                   tuple(annotation_files(settings.dataset_config)))

    def files(self) -> dict[str, Path]:
        """Every file by role: ``image_features``, ``text_features``, ``annotations_{i}`` (the gallery cache's
        key names)."""
        out = {"image_features": self.image_features, "text_features": self.text_features}
        out.update({f"annotations_{i}": p for i, p in enumerate(self.annotations)})
        return {k: p for k, p in out.items() if p is not None}

    def image_side(self) -> list[Path]:
        """What the image side is read from: the feature file, or end to end the annotation files (the image
        files themselves are checked when training starts, as ``xmr extract`` does)."""
        return list(self.annotations) if self.end_to_end else [self.image_features]

    def digest(self, backbone_weights_sha256: str | None = None) -> tuple[str, dict[str, str]]:
        """The resume digest: SHA-256 over the digests of the feature files, the text features, the annotation
        files that exist and, end to end, the backbone's weights (``backbone_weights_sha256``, which the built
        backbone reports). Also returns the parts (the run's tags). Part names are those of earlier versions,
        so an unchanged run's last.pt still matches."""
        parts = {}
        if self.end_to_end:
            parts["backbone_weights_sha256"] = backbone_weights_sha256
        else:
            parts["features_sha256"] = sha256_file(self.image_features)
        if self.text_features is not None:
            parts["text_features_sha256"] = sha256_file(self.text_features)
        for i, path in enumerate(self.annotations):
            if path.is_file():
                parts[f"annotations_{i}_sha256"] = sha256_file(path)
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest(), parts
