"""The one trainer (and the data it feeds on)."""
