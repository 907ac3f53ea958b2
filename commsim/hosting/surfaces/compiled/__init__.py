"""Compiled CUDA extensions of the libraries users run: which are served in a hosted rank."""
