"""NVML through nvidia-ml-py (`pynvml`), with the Driver protocol's return convention.

Every query returns `(nvml_return_code, value)`, 0 being NVML_SUCCESS, as SimDriver's NVML
calls do; NVMLError never escapes. NVML is initialised on first use, so importing this
module (and constructing a CudaDriver) works where libnvidia-ml.so.1 is absent: the queries
then answer NVML_ERROR_LIBRARY_NOT_FOUND.
"""

from __future__ import annotations

from typing import Any, Callable

from commsim.driver import GpuFabricInfo

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_UNKNOWN = 999

# nvmlGpuTopologyLevel_t -> the `nvidia-smi topo -m` cell for a PCIe path.
TOPOLOGY_CELLS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def _code(exc: BaseException) -> int:
    return int(getattr(exc, "value", NVML_ERROR_UNKNOWN) or NVML_ERROR_UNKNOWN)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _bus(v: Any) -> str:
    """A PCI bus id in one spelling: NVML writes 8 or 4 domain digits depending on the call."""
    dom, _, rest = _text(v).strip().lower().partition(":")
    return f"{int(dom, 16):04x}:{rest}" if rest else dom


class Nvml:
    """One process's NVML session."""

    def __init__(self) -> None:
        self._rc: int | None = None
        self._mod: Any = None

    def init(self) -> int:
        if self._rc is None:
            try:
                import pynvml
                pynvml.nvmlInit()
                self._mod, self._rc = pynvml, 0
            except ImportError:
                self._rc = NVML_ERROR_LIBRARY_NOT_FOUND
            except Exception as e:  # pynvml.NVMLError_LibraryNotFound, _DriverNotLoaded ...
                self._rc = _code(e)
        return self._rc

    def call(self, fn: Callable[[Any], Any]) -> tuple[int, Any]:
        """fn(pynvml) -> value, as (0, value) or (code, None)."""
        rc = self.init()
        if rc != 0:
            return rc, None
        try:
            return 0, fn(self._mod)
        except Exception as e:
            return _code(e), None

    # ---- devices ----------------------------------------------------------------------
    def count(self) -> tuple[int, int | None]:
        return self.call(lambda m: int(m.nvmlDeviceGetCount()))

    def by_index(self, index: int) -> tuple[int, Any]:
        return self.call(lambda m: m.nvmlDeviceGetHandleByIndex(int(index)))

    def by_uuid(self, uuid: str) -> tuple[int, Any]:
        return self.call(lambda m: m.nvmlDeviceGetHandleByUUID(uuid))

    def uuid(self, h: Any) -> tuple[int, str | None]:
        return self.call(lambda m: _text(m.nvmlDeviceGetUUID(h)))

    def driver_version(self) -> str:
        rc, v = self.call(lambda m: _text(m.nvmlSystemGetDriverVersion()))
        return v if rc == 0 else ""

    # ---- the Driver protocol's NVML calls ------------------------------------------------
    def fabric_info(self, h: Any) -> tuple[int, GpuFabricInfo | None]:
        """nvmlDeviceGetGpuFabricInfoV (v2 struct), falling back to the v1 call on drivers
        that lack it; the v1 fields either way (nvml.h `nvmlGpuFabricInfo_t`)."""
        def v2(m):
            info = m.c_nvmlGpuFabricInfo_v2_t()
            m.nvmlDeviceGetGpuFabricInfoV(h, m.byref(info))
            return info

        def v1(m):
            info = m.c_nvmlGpuFabricInfo_t()
            m.nvmlDeviceGetGpuFabricInfo(h, m.byref(info))
            return info

        rc, info = self.call(v2)
        if rc == NVML_ERROR_FUNCTION_NOT_FOUND:
            rc, info = self.call(v1)
        if rc != 0:
            return rc, None
        return 0, GpuFabricInfo(bytes(bytearray(info.clusterUuid)), int(info.status),
                                int(info.cliqueId), int(info.state))

    def p2p_status(self, h1: Any, h2: Any) -> tuple[int, int | None]:
        """NVML_P2P_CAPS_INDEX_NVLINK status, what vLLM's `is_fully_connected` reads."""
        return self.call(lambda m: int(m.nvmlDeviceGetP2PStatus(h1, h2, m.NVML_P2P_CAPS_INDEX_NVLINK)))

    def _links(self, m: Any, h: Any) -> list[tuple[int, bool]]:
        """(link, active) for every NVLink of the GPU that can carry P2P."""
        out = []
        for link in range(m.NVML_NVLINK_MAX_LINKS):
            try:
                if not m.nvmlDeviceGetNvLinkCapability(h, link, m.NVML_NVLINK_CAP_P2P_SUPPORTED):
                    continue
                out.append((link, bool(m.nvmlDeviceGetNvLinkState(h, link))))
            except m.NVMLError:
                continue   # no such link, or NVLink not supported on this GPU
        return out

    def nvlinks_up(self, h: Any) -> tuple[int, bool | None]:
        """Every P2P-capable NVLink active (FlashInfer `supports_mnnvl`, TRT-LLM, row B22); a GPU
        without NVLink has none inactive."""
        return self.call(lambda m: all(active for _, active in self._links(m, h)))

    def pci_level(self, h1: Any, h2: Any) -> tuple[int, str | None]:
        """The PCIe path between two GPUs as `nvidia-smi topo -m` names it, from
        nvmlDeviceGetTopologyCommonAncestor."""
        return self.call(lambda m: TOPOLOGY_CELLS.get(
            int(m.nvmlDeviceGetTopologyCommonAncestor(h1, h2)), "SYS"))

    # ---- the topology matrix (commsim probe) --------------------------------------------
    def link_cell(self, h1: Any, h2: Any) -> str:
        """The `nvidia-smi topo -m` cell between two GPUs: NV<n> over NVLink (direct links to
        the peer, or every active link when both GPUs hang off NVSwitches), else the PCIe
        level from nvmlDeviceGetTopologyCommonAncestor."""
        def cell(m) -> str:
            peer = _bus(m.nvmlDeviceGetPciInfo(h2).busId)
            direct = switch = 0
            for link, active in self._links(m, h1):
                if not active:
                    continue
                try:
                    kind = m.nvmlDeviceGetNvLinkRemoteDeviceType(h1, link)
                except m.NVMLError:
                    kind = None
                if kind == m.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                    switch += 1
                    continue
                try:
                    remote = _bus(m.nvmlDeviceGetNvLinkRemotePciInfo(h1, link).busId)
                except m.NVMLError:
                    continue
                if remote == peer:
                    direct += 1
            if direct:
                return f"NV{direct}"
            if switch and any(a for _, a in self._links(m, h2)):
                return f"NV{switch}"
            level = int(m.nvmlDeviceGetTopologyCommonAncestor(h1, h2))
            return TOPOLOGY_CELLS.get(level, "SYS")

        rc, v = self.call(cell)
        return v if rc == 0 else "SYS"
