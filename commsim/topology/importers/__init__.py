"""Topology importers behind one `load(spec)` that sniffs the format.

A spec is a preset name, optionally sliced (`gb200-nvl72:2`), or a file: an NCCL topology XML
(`nccl_xml`), or `nvidia-smi topo -m` text as pasted in bug reports (`nvidia_smi`, parsed by
`nvidia_smi_parse`; it needs the host count). NVML fabric info (`nvml_fabric`) is merged into
a loaded cluster, not loaded on its own. Each format is declared once, in `IMPORTERS`; the
CLI and the scenario loader both come through here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from commsim.errors import UserError
from commsim.util.fileio import read_input
from commsim.topology import presets
from commsim.topology.model import Cluster


@dataclass(frozen=True)
class Loaded:
    cluster: Cluster
    format: str                                   # the importer's name
    warnings: list[str] = field(default_factory=list)   # assumptions the import made
    detail: Any = None                            # the parsed source, importer-specific


@dataclass(frozen=True)
class Importer:
    name: str
    what: str                                     # for messages: what the spec may be
    sniff: Callable[[str, "str | None"], bool]    # (spec, file text or None) -> is it mine
    load: Callable[[str, "str | None", dict], Loaded]


def _is_preset(spec: str, text: str | None) -> bool:
    return text is None and spec.partition(":")[0] in presets.PRESETS


def _load_preset(spec: str, text: str | None, opts: dict) -> Loaded:
    return Loaded(presets.build(spec), "preset")


def _is_xml(spec: str, text: str | None) -> bool:
    from commsim.topology.importers.nccl_xml import looks_like_xml
    return text is not None and (spec.endswith(".xml") or looks_like_xml(text))


def _load_xml(spec: str, text: str | None, opts: dict) -> Loaded:
    from commsim.topology.importers import nccl_xml
    topo = nccl_xml.parse_nccl_xml(text or "", opts.get("source", spec))
    cluster, warnings = nccl_xml.build_cluster(
        topo, opts.get("gpu_model"), nvswitch=bool(opts.get("nvswitch")),
        host_prefix=opts.get("host_prefix", "node"), name=opts.get("name"))
    return Loaded(cluster, "nccl_xml", list(warnings), topo)


def _is_smi(spec: str, text: str | None) -> bool:
    from commsim.topology.importers.nvidia_smi_parse import looks_like_header
    return text is not None and any(looks_like_header(ln) for ln in text.splitlines())


def _load_smi(spec: str, text: str | None, opts: dict) -> Loaded:
    from commsim.topology.importers.nvidia_smi import build_cluster, parse_topo_matrix
    hosts = opts.get("hosts")
    if hosts is None:
        raise UserError(f"{spec}: `nvidia-smi topo -m` output needs the host count; use "
                        f"`commsim topo import {spec} --hosts N`")
    source = opts.get("source", spec)
    parsed = parse_topo_matrix(text or "", source, opts.get("p2p_text"), opts.get("p2p_source", "<p2p>"))
    cluster, warnings = build_cluster(parsed, hosts, opts.get("domain"), opts.get("gpu_model"),
                                      host_prefix=opts.get("host_prefix", "node"), name=opts.get("name"))
    return Loaded(cluster, "nvidia_smi", list(warnings), parsed)


IMPORTERS: tuple[Importer, ...] = (
    Importer("preset", "a preset name (see `commsim topo list`), e.g. gb200-nvl72:2", _is_preset, _load_preset),
    Importer("nccl_xml", "an NCCL topology .xml", _is_xml, _load_xml),
    Importer("nvidia_smi", "`nvidia-smi topo -m` text", _is_smi, _load_smi),
)


def read_text(path: str) -> str:
    # Pastes come from browsers and editors: tolerate a BOM and stray bytes.
    return read_input(path).decode("utf-8-sig", errors="replace")


def sniff(spec: str, text: str | None = None) -> Importer | None:
    """The importer whose format `spec` (and, for a file, its text) is."""
    return next((imp for imp in IMPORTERS if imp.sniff(spec, text)), None)


def accepted() -> str:
    return ", ".join(imp.what for imp in IMPORTERS)


def load(spec: str, text: str | None = None, format: str | None = None, **options: Any) -> Loaded:
    """A cluster from a preset name or a topology file, whatever its format. `text` is the
    file's content when already read (stdin); `format` names the importer that must read it
    instead of sniffing (`commsim topo import` reads any text that is not XML as `topo -m`, so
    that parser says what it missed); options go to the importer (hosts, gpu_model, domain,
    nvswitch, host_prefix, name, p2p_text, p2p_source, source)."""
    if text is None and spec.partition(":")[0] not in presets.PRESETS:
        p = Path(spec)
        if not p.exists():
            if "/" not in spec and not p.suffix:
                return _load_preset(spec, None, options)   # names the known presets
            raise UserError(f"{spec}: no such file; give {accepted()}")
        if p.is_dir():
            raise UserError(f"{spec}: is a directory; give {accepted()}")
        text = read_text(spec)
    imp = sniff(spec, text) if format is None else next(i for i in IMPORTERS if i.name == format)
    if imp is None:
        raise UserError(f"{spec}: not a topology this reads; give {accepted()}")
    return imp.load(spec, text, options)
