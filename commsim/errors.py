"""User-facing errors. The CLI prints their message (no traceback) and exits non-zero.

A message names the file, the field (or line) and the fix, e.g.
`scenarios/x.toml: [topology] preset: unknown preset 'gb300'; known presets: ...`.
"""


class UserError(Exception):
    """Bad input from a user: a malformed file, an unknown name, an out-of-range value."""

    exit_code = 2
