"""Config files: the one loader (YAML, ``extends:``, overrides, validation against ``xmr/schemas``) and the
dataset, backbone and re-ranker configs."""
