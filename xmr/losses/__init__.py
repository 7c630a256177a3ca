"""Loss functions, each a pure function of similarities/embeddings (one module per family)."""
