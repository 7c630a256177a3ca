"""xmr: image-text cross-modal retrieval pipeline."""

__version__ = "0.1.0"
