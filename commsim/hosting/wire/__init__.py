"""The wire between hosted ranks in process mode: the loopback key-value store and the rank-to-rank transport."""
