"""Visual feature extraction (backbone registry) and the HDF5 feature store."""
