"""NVLS (NVLink SHARP) set-up: the multicast object of one NVLink node and each rank's
memory bound to it (src/transport/nvls.cc nvlsAllocateMem, NVIDIA/nccl v2.27.3-1):

  cuMulticastGetGranularity; local rank 0: cuMulticastCreate(numDevices = local ranks,
  handle type) and, for FABRIC, cuMemExportToShareableHandle; the handle goes to the other
  local ranks (bootstrapIntraNodeBroadcast; a POSIX fd through the root's proxy socket), who
  import it; every rank cuMulticastAddDevice; cuMemCreate + reserve + map + access of its
  unicast buffer; an intra-node barrier; cuMulticastBindMem; reserve + map + access of the
  multicast address.

Every failing step is CUCHECKGOTO: ncclUnhandledCudaError, init fails, except the bind:
- from v2.27.3-1 a bind failure carries on without NVLS (INFO "Proceeding without NVLS
  support") unless NCCL_NVLS_ENABLE=1 forced it (then the WARN "Failed to bind NVLink SHARP
  (NVLS) Multicast memory ..." and ncclUnhandledCudaError);
- up to v2.26.6-1 the bind was CUCHECKGOTO as every other step (src/transport/nvls.cc
  nvlsGroupBindMem / nvlsAllocateMem there): init fails.
"""

from __future__ import annotations

from typing import Any

from commsim.driver import FABRIC, FD, access_desc, error_string, multicast_prop
from commsim.libmodels.nccl.calls import DriverCalls
from commsim.libmodels.nccl.errors import NcclError, UNHANDLED_CUDA
from commsim.libmodels.nccl.transports import Connector, raise_voted, vote

NVLS_SIZE = 2 << 20             # one multicast granule's worth (the size is not a rule here)
BIND_FALLBACK_SINCE = 22703     # NCCL_VERSION(2,27,3): the first with "Proceeding without NVLS"


def node_of(conn: Connector) -> list[int]:
    """The ranks of this rank's NVLink node, in rank order: its host and /dev/shm (containers
    of one host are separate nodes, row W6, as the search counts them), or its clique under
    MNNVL."""
    me = conn.me
    if conn.d.mnnvl:
        return [p.rank for p in conn.infos if p.node == me.node]
    return [p.rank for p in conn.infos if (p.host, p.facts.shm) == (me.host, me.facts.shm)]


def setup(conn: Connector, version: int, forced: bool) -> str:
    """NVLS for this rank's node; what happened ("NVLS on", or why off). Raises NcclError
    where init fails. Every rank of the communicator takes part in the votes."""
    c: DriverCalls = conn.c
    node = node_of(conn)
    root = node[0]
    me, dev, htype = conn.rank, conn.me.cuda_dev, conn.htype
    mc, err, blob = None, None, None
    prop = multicast_prop(len(node), NVLS_SIZE, htype)
    try:
        gran = int(c.check("cuMulticastGetGranularity", prop, 1))
        size = (NVLS_SIZE + gran - 1) // gran * gran
        prop = multicast_prop(len(node), size, htype)
        if me == root:
            mc = c.check("cuMulticastCreate", prop)
            conn.res.undo.append(lambda: c.call("cuMemRelease", mc))
            if htype == FABRIC:
                out = c.check("cuMemExportToShareableHandle", mc, FABRIC, 0)
                blob = bytes(getattr(out, "data", out))
    except NcclError as e:
        err = e
    got = conn.group.all_gather_object((None if err is None else (err.code, err.warn), blob),
                                       tag="ncclCommInitRank: NVLS multicast handle")
    raise_voted(err, [g[0] for g in got])
    try:
        if me == root and htype == FD:
            for peer in node[1:]:
                fd = c.check("cuMemExportToShareableHandle", mc, FD, 0)
                try:
                    c.send_fd(fd, conn.infos[peer].pid)
                finally:
                    conn.driver_close(fd)
        if me != root:
            if htype == FABRIC:
                mc = c.check("cuMemImportFromShareableHandle", got[root][1], FABRIC)
            else:
                fd = c.receive_fd(conn.infos[root].pid)
                try:
                    mc = c.check("cuMemImportFromShareableHandle", fd, FD)
                finally:
                    conn.driver_close(fd)
            conn.res.undo.append(lambda: c.call("cuMemRelease", mc))
        c.check("cuMulticastAddDevice", mc, dev)
        uc, _, ucsize = conn.cumem_alloc(size, htype)
    except NcclError as e:
        err = e
    vote(conn.group, err, "ncclCommInitRank: NVLS devices added (intra-node barrier)")
    note, err = "NVLS on: multicast object bound and mapped", None
    res = c.call("cuMulticastBindMem", mc, 0, uc, 0, ucsize, 0)
    if int(res[0]) != 0:
        text = f"CUDA error {int(res[0])} '{error_string(res[0])}'"
        if version < BIND_FALLBACK_SINCE or forced:
            if forced and version >= BIND_FALLBACK_SINCE:
                warn = (f"Failed to bind NVLink SHARP (NVLS) Multicast memory of size {ucsize} : "
                        f"{text}.\nThis is usually caused by a system or configuration error in "
                        f"the Fabric Manager or NVSwitches.\nDo not force-enable NVLS "
                        f"(NCCL_NVLS_ENABLE=1) if you wish to avoid this error in the future.")
            else:
                warn = f"Cuda failure {int(res[0])} '{error_string(res[0])}'"
            c.log.warn(warn)
            err = NcclError(UNHANDLED_CUDA, warn, "cuMulticastBindMem")
        else:
            note = (f"NVLS off: Failed to bind NVLink SHARP (NVLS) Multicast memory of size "
                    f"{ucsize} : {text}. Proceeding without NVLS support.")
            c.log.info(note.removeprefix("NVLS off: "))
    else:
        conn.res.undo.append(lambda: c.call("cuMulticastUnbind", mc, dev, 0, ucsize))
        try:
            va = c.check("cuMemAddressReserve", size, 0, 0, 0)
            conn.res.undo.append(lambda: c.call("cuMemAddressFree", va, size))
            c.check("cuMemMap", va, size, 0, mc, 0)
            conn.res.undo.append(lambda: c.call("cuMemUnmap", va, size))
            c.check("cuMemSetAccess", va, size, [access_desc(dev)], 1)
        except NcclError as e:
            err = e
    got = conn.group.all_gather_object((None if err is None else (err.code, err.warn),
                                        note.startswith("NVLS on")), tag="ncclCommInitRank: NVLS bound")
    raise_voted(err, [g[0] for g in got])
    if not all(g[1] for g in got) and note.startswith("NVLS on"):
        # A peer went on without NVLS: the communicator has no NVLS (every rank's
        # nvlsSupport feeds the algorithm search; UNCONFIRMED how a split outcome resolves).
        note = "NVLS off: a peer's bind failed"
    return note
