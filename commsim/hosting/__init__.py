"""Hosting: what a user's unmodified program sees as a rank of a simulated machine, in
three layers that import one way: `surfaces/` (fakes of foreign packages,
grouped by the package they answer) -> `state/` (the rank running the call: `session`) ->
`install/` (the surface registry, the patch recorder, the per-rank dispatcher). The run
machinery that starts ranks (commsim/launch/) sits above and is never imported from here."""

from commsim.hosting.state.session import HostedRank, NotHosted, RankEvents, bound, current

__all__ = ["HostedRank", "NotHosted", "RankEvents", "bound", "current"]
