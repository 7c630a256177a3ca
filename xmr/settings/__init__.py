"""A run config turned into frozen, typed settings, one per concern, which every part below the trainer takes."""
