"""pytest plugin (entry point `pytest11`): run a project's own distributed tests as the ranks
of a simulated machine.

    pytest --commsim-machine gb200-nvl72:2 [--commsim-nproc-per-host 4] [--commsim-mode procs]

    @pytest.mark.commsim(machine="gb200-nvl72:2", ranks=8)
    def test_workspace(commsim_rank):
        dist.init_process_group("nccl")
        ...

A test is hosted when it carries the `commsim` marker or asks for the `commsim_rank` fixture.
Its machine is the marker's `machine`, else `--commsim-machine`; without either it is
skipped. In inproc mode (the default: fast, deterministic) the test function runs as every
rank in this process; in procs mode every rank is a process running just this test under
pytest. The test fails when any rank fails, with the run's verdict as the message: its first
line is the root cause (what pytest's summary line and a CI's test list show), then the
verdict, and the replay command names the test node (`pytest path::test --commsim-...`).

Collection is hosted too: with `--commsim-machine` the hosting surfaces are installed before
the first conftest and test module are imported, so a module-level `from cuda.bindings import
driver` (FlashInfer's `comm/mnnvl.py`) takes the stand-in, which answers as the real module
outside a rank and as the simulated driver inside one, as under `commsim exec`. Where the
surfaces came too late for that (a `commsim` marker without the option), an inproc test whose
imported modules still hold a real replaced module runs in procs mode, where each rank's
interpreter installs hosting before it collects, and the verdict says so; a blocking socket
between ranks sends an inproc test to procs mode as it sends `commsim exec`.
"""

from __future__ import annotations

import io
import os
import shlex
from typing import Any

import pytest

from commsim.errors import UserError
from commsim.hosting.state.session import current


def pytest_addoption(parser: Any) -> None:
    g = parser.getgroup("commsim", "run distributed tests as ranks of a simulated machine")
    g.addoption("--commsim-machine", default=None, metavar="PRESET[:HOSTS]",
                help="machine for hosted tests (gb200-nvl72:2, hgx-h100-8)")
    g.addoption("--commsim-nproc-per-host", type=int, default=0, metavar="N",
                help="ranks per host (default: one per GPU, or the marker's ranks)")
    g.addoption("--commsim-mode", default="inproc", choices=("inproc", "procs"),
                help="inproc: ranks as greenlets (default); procs: a process per rank")
    g.addoption("--commsim-seed", type=int, default=0, help="seed of hosted runs")
    g.addoption("--commsim-timeout", type=float, default=120.0, help="seconds before a hang")
    g.addoption("--commsim-residue", default="report", choices=("report", "fail"),
                help="memory, mappings and fds a rank holds at exit: report them (default) or "
                     "fail the test on them")
    g.addoption("--commsim-visible", default="all", choices=("all", "one"),
                help="GPUs each rank sees: its host's (all) or its own (one)")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: Any, parser: Any, args: list[str]) -> None:
    """Install hosting before conftests and test modules are imported (they may import a
    hosted module at their top); a rank process (procs mode) has it from its bootstrap."""
    if getattr(early_config.known_args_namespace, "commsim_machine", None) and \
            not os.environ.get("COMMSIM_HOSTING"):
        _install_hosting()


def _install_hosting() -> None:
    from commsim.hosting.install.registry import install_all
    from commsim.hosting.surfaces.table import MODULES
    install_all(MODULES)


def pytest_configure(config: Any) -> None:
    config.addinivalue_line(
        "markers", "commsim(machine=None, ranks=None, nproc_per_host=None, mode=None, "
                   "visible=None, seed=None, residue=None): run this test as every rank of a simulated machine")


class _RankView:
    """The `commsim_rank` fixture: the running rank's HostedRank, looked up at each use (the
    fixture is made once, the test runs as many ranks)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(current(), name)

    def __repr__(self) -> str:
        return f"<commsim rank view: {current()!r}>"


@pytest.fixture
def commsim_rank() -> Any:
    """The hosted rank running the test (rank, world_size, host, driver, visible ...)."""
    return _RankView()


def _hosted_item(item: Any) -> bool:
    return item.get_closest_marker("commsim") is not None or "commsim_rank" in getattr(
        item, "fixturenames", ())


def _config_for(item: Any) -> Any:
    from commsim.launch.config import RunConfig
    m = item.get_closest_marker("commsim")
    kw = dict(m.kwargs) if m is not None else {}
    opt = item.config.getoption
    machine = kw.get("machine") or opt("--commsim-machine")
    if not machine:
        return None
    return RunConfig(machine=machine, ranks=int(kw.get("ranks") or 0),
                     nproc_per_host=int(kw.get("nproc_per_host") or opt("--commsim-nproc-per-host") or 0),
                     mode=kw.get("mode") or opt("--commsim-mode"),
                     seed=int(kw.get("seed") if kw.get("seed") is not None else opt("--commsim-seed")),
                     visible=kw.get("visible") or opt("--commsim-visible"),
                     timeout=float(opt("--commsim-timeout")),
                     residue=kw.get("residue") or opt("--commsim-residue"),
                     command=["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                              "-p", "no:randomly", item.nodeid])


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: Any) -> Any:
    if os.environ.get("COMMSIM_HOSTING") or not _hosted_item(pyfuncitem):
        return None      # not hosted, or already a rank (procs mode): pytest runs the test
    from commsim.launch.run import execute
    from commsim.launch.verdict import STALE_MODULES
    cfg = _config_for(pyfuncitem)
    if cfg is None:
        pytest.skip("hosted test: give --commsim-machine or @pytest.mark.commsim(machine=...)")
    cfg.replay = _replay(pyfuncitem, cfg)
    funcargs = {n: pyfuncitem.funcargs[n] for n in pyfuncitem._fixtureinfo.argnames}
    out = io.StringIO()
    target = None
    procs_command = cfg.command[:-1] + [str(pyfuncitem.path) + "::" + pyfuncitem.name]
    stale = _stale_references(pyfuncitem) if cfg.mode == "inproc" else []
    if stale:
        out.write(f"commsim: {stale[0]}: {STALE_MODULES}; running in procs mode\n")
        cfg.mode = "procs"
    if cfg.mode == "inproc":
        target = lambda: pyfuncitem.obj(**funcargs)   # noqa: E731
        cfg.command = [str(pyfuncitem.path)]
    else:
        cfg.command = procs_command
    try:
        v = execute(cfg, out=out, err=out, echo=True, target=target, procs_command=procs_command)
    except UserError as e:
        pytest.fail(f"commsim: {e}", pytrace=False)
    if stale:
        v.needs_procs, v.procs_reason = "; ".join(stale[:3]), STALE_MODULES
    print(out.getvalue(), end="")
    if not v.ok:
        from commsim.launch.cause import root_cause_line
        pytest.fail(f"commsim: {root_cause_line(v)}\n{v.format()}", pytrace=False)
    return True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Any:
    """In a rank process (procs mode) pytest catches the test's exception, so no excepthook
    sees it: the rank's report names it as `commsim exec`'s would, not pytest's summary."""
    yield
    exc = call.excinfo
    if (call.when == "call" and exc is not None and os.environ.get("COMMSIM_HOSTING")
            and _hosted_item(item) and not exc.errisinstance(pytest.skip.Exception)):
        from commsim.launch.bootstrap import record_exception
        record_exception(exc.type, exc.value)


def _stale_references(item: Any) -> list[str]:
    """What the test's module and its conftests reach of the real modules hosting replaces
    (installed now, as the inproc run would)."""
    from commsim.hosting.install.stale import stale_references
    _install_hosting()
    here = item.path.parent
    conftests = [p for p in item.config.pluginmanager.get_plugins()
                 if getattr(p, "__file__", "").endswith("conftest.py")
                 and here.is_relative_to(os.path.dirname(p.__file__))]
    return stale_references([item.module, *conftests])


def _replay(item: Any, cfg: Any) -> str:
    """The pytest command that runs this test node again on the same machine, mode and seed
    (the plugin's options; a marker's own values win over them, and equal them here)."""
    words = ["pytest", item.nodeid, "--commsim-machine", cfg.machine,
             "--commsim-mode", cfg.mode, "--commsim-seed", str(cfg.seed)]
    if cfg.nproc_per_host and not cfg.ranks:
        words += ["--commsim-nproc-per-host", str(cfg.nproc_per_host)]
    if cfg.visible != "all":
        words += ["--commsim-visible", cfg.visible]
    if cfg.residue != "report":
        words += ["--commsim-residue", cfg.residue]
    return shlex.join(words)
