"""Hosting: run users' unmodified programs as the ranks of a simulated machine (DESIGN.md
section 9). `commsim exec` (commands/exec.py), the pytest plugin (pytest_plugin.py) and
`sweep --exec` (sweep_exec.py) drive `run.execute`; a hosted program sees the surfaces
registered in `surfaces` and answered for its rank (`session.current()`)."""

from commsim.hosting.state.session import HostedRank, NotHosted, RankEvents, bound, current

__all__ = ["HostedRank", "NotHosted", "RankEvents", "bound", "current", "bootstrap"]


def bootstrap() -> None:
    """Host this interpreter when COMMSIM_HOSTING names a run's config (start-up hook)."""
    from commsim.launch.bootstrap import bootstrap as _bootstrap
    _bootstrap()
