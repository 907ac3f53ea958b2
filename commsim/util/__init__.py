"""Small utilities with one job each: atomic output files, signals as exceptions, os._exit
that unwinds, pid liveness."""
