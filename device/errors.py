"""Errors of the device layer that a user can act on (printed without a traceback)."""

from __future__ import annotations

from commsim.errors import UserError


class NoGpuError(UserError):
    """No usable NVIDIA GPU here; the message names what is missing (driver library, device,
    ordinal) and what the CUDA call answered."""
