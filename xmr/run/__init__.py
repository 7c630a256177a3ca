"""A run: its config (from a recipe or its run directory), the files it reads, its key and paths, its checkpoint
files, the writer's lock, the gallery cache, its results files and its MLflow record."""
