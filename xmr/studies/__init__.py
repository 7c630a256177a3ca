"""Studies over many runs: experiments (ablations, sweeps, comparisons), the seeded benchmark and the model zoo."""
