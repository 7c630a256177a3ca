"""A trained model in use: built or loaded from a run, fed by the loaders, encoding, scoring and searching
(``xmr.load``)."""
