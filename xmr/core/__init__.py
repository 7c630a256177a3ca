"""Foundations: the one error type, name registries and plugins, torch on first use, small helpers (device,
seeds), progress lines, CPU numerics settings, atomic files and checkpoint I/O. They import nothing else of xmr."""
