"""`mpi4py` for a hosted rank."""
