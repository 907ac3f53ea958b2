"""The install layer: the registry of surfaces, the import hooks and the ctypes CDLL interposer.

Nothing here knows a foreign module; surfaces register with it."""
