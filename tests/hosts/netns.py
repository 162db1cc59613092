"""Network namespaces for test hosts, so traffic between them and this machine crosses a network.

One bridge per host set (thbr<first slot>, 10.213.<first slot>.1/24 on this machine) and per host
a namespace th<slot> holding one end of a veth pair (10.213.<first slot>.<slot>/24), the other end
on the bridge. Hosts reach each other over the bridge; nothing is routed beyond it. Every name and
address is derived from the run's own locked slots, so concurrent runs never collide, and all of
it goes away with the namespace and the bridge.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

SUBNET_PREFIX = "10.213"


class NetnsError(RuntimeError):
    """A namespace, veth or bridge could not be created."""


def _ip(*args: str, check: bool = True) -> None:
    proc = subprocess.run(["ip", *args], check=False, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")


def bridge_name(first_slot: int) -> str:
    return f"thbr{first_slot}"


def address(first_slot: int, slot: int) -> str:
    return f"{SUBNET_PREFIX}.{first_slot}.{slot}"


def create_bridge(first_slot: int) -> str:
    name = bridge_name(first_slot)
    delete_link(name)  # a dead run's leftover with our (now locked) slot
    _ip("link", "add", name, "type", "bridge")
    _ip("addr", "add", f"{address(first_slot, 1)}/24", "dev", name)
    _ip("link", "set", name, "up")
    return name


def create_namespace(first_slot: int, slot: int) -> str:
    """Namespace th<slot> with lo up and a veth into the run's bridge; returns its /run/netns path."""
    ns, outer, inner = f"th{slot}", f"thv{slot}", f"thp{slot}"
    delete_namespace(ns)
    delete_link(outer)
    _ip("netns", "add", ns)
    _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
    _ip("link", "set", inner, "netns", ns)
    _ip("link", "set", outer, "master", bridge_name(first_slot))
    _ip("link", "set", outer, "up")
    _ip("-n", ns, "addr", "add", f"{address(first_slot, slot)}/24", "dev", inner)
    _ip("-n", ns, "link", "set", inner, "up")
    _ip("-n", ns, "link", "set", "lo", "up")
    return f"/run/netns/{ns}"


def link_down(slot: int) -> None:
    """Cut a host off the network (its veth on the bridge goes down): a dropped link."""
    _ip("link", "set", f"thv{slot}", "down")


def link_up(slot: int) -> None:
    _ip("link", "set", f"thv{slot}", "up")


def delete_namespace(ns: str) -> None:
    """The namespace and its veth pair (deleted here: the kernel would drop it only lazily)."""
    delete_link(f"thv{ns.removeprefix('th')}")
    if Path(f"/run/netns/{ns}").exists():
        _ip("netns", "del", ns)


def delete_link(name: str) -> None:
    if Path(f"/sys/class/net/{name}").exists():
        _ip("link", "del", name)
