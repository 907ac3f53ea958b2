"""Per-rank state of a hosted program: who the running code is, its driver, its CUDA state."""
