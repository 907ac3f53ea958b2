"""The fidelity rules' machine facts on the topology model (docs/fidelity-rules.md): IMEX domains as host sets (row I2), container
caps (W4-W7), P2P facts beside the NVLink state (N1, P1-P3), driver version (H2)."""

from __future__ import annotations

import dataclasses

import pytest

from commsim.topology.model import ContainerCaps, ImexDomain, Link, TopologyError
from commsim.topology.presets import build


def test_default_imex_domain_is_the_multi_node_nvlink_domain() -> None:
    c = build("gb200-nvl72:3")
    hosts = [h.name for h in c.hosts]
    assert c.same_imex_domain(hosts[0], hosts[2])
    assert c.imex_domain_of(hosts[1]).hosts == tuple(hosts)


def test_a_host_without_a_multi_node_domain_only_reaches_itself() -> None:
    c = build("dgx-spark-2")
    assert c.imex_domain_of("spark-0") is None
    assert c.same_imex_domain("spark-0", "spark-0") and not c.same_imex_domain("spark-0", "spark-1")


def test_declared_imex_domains_split_one_nvlink_domain() -> None:
    c = build("gb200-nvl72:4")
    h = [x.name for x in c.hosts]
    split = dataclasses.replace(c, imex_domains=(ImexDomain("a", tuple(h[:2])),
                                                 ImexDomain("b", tuple(h[2:]))))
    assert split.same_domain(split.domains[0].members[0], split.domains[0].members[-1])
    assert split.same_imex_domain(h[0], h[1]) and not split.same_imex_domain(h[1], h[2])


@pytest.mark.parametrize("domains, words", [
    ((ImexDomain("a", ("nope",)),), "IMEX domain a: unknown host 'nope'"),
    ((ImexDomain("a", ("gb200-nvl72-tray00",)), ImexDomain("b", ("gb200-nvl72-tray00",))),
     "host gb200-nvl72-tray00 is in two IMEX domains (a, b)"),
])
def test_imex_domains_are_validated(domains, words) -> None:
    with pytest.raises(TopologyError, match=words.replace("(", r"\(").replace(")", r"\)")):
        dataclasses.replace(build("gb200-nvl72:2"), imex_domains=domains)


def test_container_without_the_imex_device_has_no_usable_channel() -> None:
    h = build("gb200-nvl72:1").hosts[0]
    assert h.usable_imex_channels == (0,)
    boxed = dataclasses.replace(h, container=ContainerCaps(imex_channel_dev=False))
    assert boxed.imex_channels == (0,) and boxed.usable_imex_channels == ()


def test_driver_version_is_checked_and_has_a_major() -> None:
    c = build("hgx-h100-8")
    h = c.hosts[0]
    assert h.driver_version == "" and c.driver_major(h.name) == c.versions.driver_major
    assert c.replace_host(h.name, driver_version="470.57.02").driver_major(h.name) == 470
    with pytest.raises(TopologyError, match="driver_version 'new' is not a version"):
        dataclasses.replace(h, driver_version="new")


def test_reported_p2p_is_not_always_real() -> None:
    assert Link("PIX").p2p_real
    assert not Link("PIX", ipc_refused="acs").p2p_real and Link("PIX", ipc_refused="acs").p2p
    assert not Link("PHB", peer_writes="corrupt").p2p_real
    assert Link("NV", 18, p2p=False, p2p_reason="disabled").is_nvlink


@pytest.mark.parametrize("kw, words", [({"ipc_refused": "nope"}, "ipc_refused 'nope'"),
                                       ({"peer_writes": "late"}, "peer_writes 'late'"),
                                       ({"p2p_reason": "XNS"}, "p2p_reason 'XNS'")])
def test_link_facts_are_validated(kw, words) -> None:
    with pytest.raises(TopologyError, match=words):
        Link("PIX", **kw)
