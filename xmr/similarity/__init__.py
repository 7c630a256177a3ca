"""Similarity between image and caption embeddings, single vectors or sets: the measures (``SIMILARITIES``), a
batch's differentiable set similarity for the losses, and the chunked matrix of a whole split."""
