"""JSON schemas (YAML) for configs."""
