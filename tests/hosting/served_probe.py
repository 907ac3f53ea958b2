"""A served op's implementation for test_served_torch_ops.py (called with the rank first)."""


def scaled(r, x: int, k: int = 2) -> int:
    return k * x + r.rank
