"""Small utilities with one job each: atomic output files and input checks, signals as
exceptions, pid liveness."""
