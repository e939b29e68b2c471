"""The rig's network: a namespace per node, each with a management interface and a primary and
a backup data interface, wired to one bridge per plane in a switch namespace of their own.
Nothing is put in the caller's namespace; every name starts with ``tdrig-``, so a teardown
(also of a run that died) removes exactly what a rig made.

Addresses (inside the namespaces only): management ``10.251.0.K+1``, primary plane
``10.251.1.K+1``, backup plane ``10.251.2.K+1`` (/24). Each node's data interfaces are ``pri`` and
``bak``; its cable into the switch is ``nK-pri`` / ``nK-bak`` in ``tdrig-sw``.
"""

from __future__ import annotations

import json
import subprocess
from typing import Dict, List, Optional

PREFIX = "tdrig-"
SWITCH = PREFIX + "sw"
PLANES = {"mg": 0, "pri": 1, "bak": 2}
BRIDGES = {"mg": "br-mg", "pri": "br-pri", "bak": "br-bak"}
DATA = ("pri", "bak")


class NetError(Exception):
    """A command building or changing the rig's network failed."""


def run(argv: List[str], check: bool = True) -> str:
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
    if check and p.returncode != 0:
        raise NetError("%s: %s" % (" ".join(argv), p.stdout.decode(errors="replace").strip()))
    return p.stdout.decode(errors="replace")


def ns(node: int) -> str:
    return "%sn%d" % (PREFIX, node)


def addr(plane: str, node: int) -> str:
    return "10.251.%d.%d" % (PLANES[plane], node + 1)


def cable(node: int, plane: str) -> str:
    """The switch-side end of a node's interface."""
    return "n%d-%s" % (node, plane)


def existing() -> List[str]:
    """The rig's namespaces that exist now."""
    out = run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def teardown() -> List[str]:
    """Deletes every ``tdrig-`` namespace (their interfaces and bridges go with them)."""
    gone = existing()
    for name in gone:
        run(["ip", "netns", "del", name], check=False)
    return gone


def _sysctl(name: str, *settings: str) -> None:
    run(["ip", "netns", "exec", name, "sysctl", "-q", "-w", *settings])


def build(nodes: int) -> None:
    """The network for ``nodes`` nodes (tearing down a previous rig's first)."""
    teardown()
    run(["ip", "netns", "add", SWITCH])
    run(["ip", "-n", SWITCH, "link", "set", "lo", "up"])
    _sysctl(SWITCH, "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
    for br in BRIDGES.values():
        run(["ip", "-n", SWITCH, "link", "add", br, "type", "bridge"])
        run(["ip", "-n", SWITCH, "link", "set", br, "up"])
    for k in range(nodes):
        _node(k)


def _node(k: int) -> None:
    name = ns(k)
    run(["ip", "netns", "add", name])
    run(["ip", "-n", name, "link", "set", "lo", "up"])
    _sysctl(name, "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1",
            "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
            "net.ipv4.conf.all.arp_ignore=0")
    for plane in PLANES:
        peer = cable(k, plane)
        run(["ip", "link", "add", plane, "netns", name, "type", "veth", "peer", "name", peer,
             "netns", SWITCH])
        run(["ip", "-n", SWITCH, "link", "set", peer, "master", BRIDGES[plane], "up"])
        run(["ip", "-n", name, "addr", "add", addr(plane, k) + "/24", "dev", plane])
        run(["ip", "-n", name, "link", "set", plane, "up"])
        _sysctl(name, "net.ipv4.conf.%s.rp_filter=0" % plane)


def set_cable(node: int, plane: str, up: bool) -> None:
    """Plugs or pulls a node's cable: the switch-side end goes up or down, and the node's
    interface loses or regains its carrier."""
    run(["ip", "-n", SWITCH, "link", "set", cable(node, plane), "up" if up else "down"])


def link_up(node: int, plane: str) -> bool:
    """Whether the kernel calls the node's interface up (operstate; it follows a carrier change
    a moment later)."""
    info = json.loads(run(["ip", "-n", ns(node), "-j", "link", "show", "dev", plane]))
    return bool(info) and info[0].get("operstate") == "UP"


def limit(node: int, plane: str, rate: str) -> None:
    """Rate-limits a node's link both ways (``tc ... tbf`` on each end)."""
    for where, dev in ((ns(node), plane), (SWITCH, cable(node, plane))):
        run(["ip", "netns", "exec", where, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
             "rate", rate, "burst", "1600", "latency", "200ms"])


def unlimit(node: int, plane: str) -> None:
    for where, dev in ((ns(node), plane), (SWITCH, cable(node, plane))):
        run(["ip", "netns", "exec", where, "tc", "qdisc", "del", "dev", dev, "root"], check=False)


def counters(nodes: int) -> Dict[str, Dict[str, int]]:
    """Bytes each node's interfaces received and sent: ``{"n0/pri": {"rx": .., "tx": ..}}``."""
    out = {}
    for k in range(nodes):
        links = json.loads(run(["ip", "-n", ns(k), "-j", "-s", "link", "show"]))
        for link in links:
            if link.get("ifname") in PLANES:
                stats = link.get("stats64") or link.get("stats")
                out["n%d/%s" % (k, link["ifname"])] = {
                    "rx": int(stats["rx"]["bytes"]), "tx": int(stats["tx"]["bytes"])}
    return out


def delta(before: Dict[str, Dict[str, int]], after: Dict[str, Dict[str, int]]) -> Dict[str, int]:
    """Bytes (received + sent) per interface between two readings."""
    return {k: (after[k]["rx"] - before[k]["rx"]) + (after[k]["tx"] - before[k]["tx"]) for k in after}


def exec_argv(node: Optional[int], argv: List[str]) -> List[str]:
    """``argv`` run inside node ``node``'s namespace."""
    return ["ip", "netns", "exec", ns(node), *argv] if node is not None else list(argv)
