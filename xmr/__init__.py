"""xmr: image-text cross-modal retrieval pipeline."""

__version__ = "0.1.0"


def load(run, device: str = "auto"):
    """A trained model for inference (``encode_image``, ``encode_text``, ``encode_split``, ``similarity``,
    ``search``) from a run directory, a checkpoint path or an MLflow run id; see :mod:`xmr.inference.model`. Its
    methods return float32 NumPy arrays and take NumPy arrays or torch tensors."""
    from xmr.inference.model import load as _load  # lazy: `import xmr` stays light for the CLI

    return _load(run, device)
