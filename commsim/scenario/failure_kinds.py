"""The kinds of failure the oracle reports, in the order the sweep's table lists them.

Declared apart from the oracle so that what only reads or prints a sweep's report (its JSON,
`sweep merge`, the launcher of `sweep --exec`) does not import the backends, and torch with
them, to learn the names."""

from __future__ import annotations

KINDS = ("illegal-backend", "not-best", "cuda-error", "numerics", "leak", "nondeterministic",
         "knob-outcome", "nccl-outcome", "outcome")
