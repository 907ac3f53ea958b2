"""What the launcher tells a rank: torchrun's (or Open MPI mpirun's) environment, plus what the
hosting bootstrap reads (COMMSIM_HOSTING*), the GPUs it sees and a free rendezvous port. The
same in both modes: a procs-mode rank gets it as its process environment, an inproc rank as
its own os.environ view."""

from __future__ import annotations

import os
import socket
from typing import Any

from commsim.launch.config import RunConfig
from commsim.launch import visible_devices
from commsim.sim import visibility
from commsim.procs import tree

_COMMSIM_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loopback_ifname() -> str | None:
    try:
        names = [n for _, n in socket.if_nameindex()]
    except OSError:
        return None
    return "lo" if "lo" in names else next((n for n in names if n.startswith("lo")), None)


def _view(cfg: RunConfig, rank: int) -> Any:
    """The scenario's view for `rank` (its container and CUDA_VISIBLE_DEVICES), or None."""
    if not cfg.scenario or cfg.visible != "all":
        return None                     # --visible on the command line overrides the file
    view = cfg._scenario().view(rank)
    return view if view.devices is not None or view.visible is not None else None


def container_of(cfg: RunConfig, rank: int, cluster: Any) -> tuple[int, ...] | None:
    """The host GPU indices rank `rank`'s container holds (a scenario's `[placement]
    devices`), which NVML there enumerates; None: the whole host."""
    view = _view(cfg, rank)
    if view is None or view.devices is None:
        return None
    host = cluster.host(cfg.placement[rank][0])
    return visibility.container_devices(view.devices, len(host.gpus))


def visible_of(cfg: RunConfig, rank: int, cluster: Any) -> tuple[int, ...]:
    host, gi = cfg.placement[rank]
    view = _view(cfg, rank)
    if view is not None:
        return visibility.process_view(visibility.host_uuids(cluster.host(host)), view.devices,
                                       view.visible)
    if cfg.visible == "one":
        return (gi,)
    if visible_devices.is_list(cfg.visible):
        return visible_devices.seen(visible_devices.for_rank(cfg.visible, rank),
                                    visible_devices.host_uuids(cluster.host(host)))
    return tuple(g.index for g in cluster.host(host).gpus)


_LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                  "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                  "TORCHELASTIC_MAX_RESTARTS", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                  "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                  "OMPI_COMM_WORLD_NODE_RANK", "OMPI_UNIVERSE_SIZE")


def launcher_env(cfg: RunConfig, rank: int, port: int) -> dict[str, str]:
    """What the launcher itself tells a rank: torchrun's variables, or Open MPI mpirun's."""
    lr, lws = cfg.local_rank(rank)
    if cfg.launcher == "mpirun":
        # Open MPI sets these on every process it starts ("Environment variables set for MPI
        # applications", Open MPI 5.0 docs, tuning-apps/environment-var). NODE_RANK counts
        # across all jobs on the node; a hosted run is the node's only job, so it equals
        # the local rank. UNIVERSE_SIZE: the slots allocated, here the ranks placed.
        return dict(OMPI_COMM_WORLD_SIZE=str(cfg.world_size), OMPI_COMM_WORLD_RANK=str(rank),
                    OMPI_COMM_WORLD_LOCAL_SIZE=str(lws), OMPI_COMM_WORLD_LOCAL_RANK=str(lr),
                    OMPI_COMM_WORLD_NODE_RANK=str(lr), OMPI_UNIVERSE_SIZE=str(cfg.world_size))
    return dict(
        RANK=str(rank), LOCAL_RANK=str(lr), WORLD_SIZE=str(cfg.world_size),
        LOCAL_WORLD_SIZE=str(lws), GROUP_RANK=str(cfg.host_index(rank)),
        GROUP_WORLD_SIZE=str(cfg.num_hosts), ROLE_RANK=str(rank), ROLE_NAME="default",
        ROLE_WORLD_SIZE=str(cfg.world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
        TORCHELASTIC_RUN_ID=f"commsim-{os.path.basename(cfg.run_dir)}",
        TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0")


def run_mark(cfg: RunConfig) -> str:
    """The environment entry every process of the run carries, whatever it starts or however
    it daemonizes: how procs/tree.py finds them all."""
    return f"COMMSIM_HOSTING={os.path.join(cfg.run_dir, 'config.json')}"


def rank_env(cfg: RunConfig, rank: int, cluster: Any, base: dict[str, str], boot_dir: str,
             port: int) -> dict[str, str]:
    """The environment the launcher gives a rank, plus what hosting needs."""
    host, gi = cfg.placement[rank]
    env = dict(base)
    mine = launcher_env(cfg, rank, port)
    for k in _LAUNCHER_VARS:      # an outer launcher's variables must not leak into a rank
        if k not in mine:
            env.pop(k, None)
    env.update(mine)
    env.update(
        OMP_NUM_THREADS=base.get("OMP_NUM_THREADS", "1"),
        COMMSIM_HOSTING=run_mark(cfg).split("=", 1)[1],
        COMMSIM_HOSTING_RANK=str(rank), COMMSIM_HOSTING_SLOT=str(rank),
        **{tree.PARENT_ENV: str(os.getpid())},
        COMMSIM_HOSTING_HOST=host,
        COMMSIM_HOSTING_VISIBLE=",".join(str(i) for i in visible_of(cfg, rank, cluster)),
        COMMSIM_HOSTING_CONTAINER=",".join(str(i) for i in container_of(cfg, rank, cluster) or ()),
        PYTHONPATH=os.pathsep.join([boot_dir, _COMMSIM_ROOT] +
                                   ([base["PYTHONPATH"]] if base.get("PYTHONPATH") else [])),
        TORCH_CPP_LOG_LEVEL=base.get("TORCH_CPP_LOG_LEVEL", "ERROR"),
    )
    lo = _loopback_ifname()
    if lo and "GLOO_SOCKET_IFNAME" not in base:
        env["GLOO_SOCKET_IFNAME"] = lo      # gloo listens on loopback only
    if cfg.visible == "one":
        env["CUDA_VISIBLE_DEVICES"] = str(gi)
    elif visible_devices.is_list(cfg.visible):
        env["CUDA_VISIBLE_DEVICES"] = visible_devices.for_rank(cfg.visible, rank)
    elif _view(cfg, rank) is not None and _view(cfg, rank).visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = _view(cfg, rank).visible
    else:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    return env
