"""The install layer: the registry of surfaces, the patch recorder that makes and restores every
change to a foreign module, the per-rank dispatcher, the import hooks and the ctypes CDLL
interposer.

Nothing here knows a foreign module's semantics; surfaces register with it."""
