"""commsim: a simulation-first GPU communicator with a pluggable device layer."""

__version__ = "0.1.0"
