"""Nodes with network stacks of their own on one machine: a Linux bridge, and one network
namespace per node joined to it by a veth pair, each with its own address. Processes started in
a node's namespace reach the others only over the bridge (nothing crosses nodes over loopback),
so a node's link can be cut (``cut``/``mend``) or slowed (``limit``: a token bucket, ``tc tbf``)
as a real machine's would be. For the tests of several nodes and ``liver bench nodes``.

Needs root and iproute2 (``ip``, ``tc``); ``unavailable()`` says why not where they are missing,
and the callers fall back to loopback, saying so.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess

IFACE = "eth0"  # every node's interface inside its namespace (what --iface names)
_SUBNETS = itertools.count()


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise OSError(f"{' '.join(cmd)}: {r.stderr.strip() or r.returncode}")


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "not root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` (iproute2)"
    probe = f"lvprobe{os.getpid()}"
    try:
        _ip("ip", "netns", "add", probe)
    except OSError as e:
        return f"cannot make a network namespace ({e})"
    _ip("ip", "netns", "del", probe)
    return None


def tcp_peers(pid: int) -> set[tuple[str, str]]:
    """The (local, remote) IPv4 addresses of the established TCP connections in process ``pid``'s
    network namespace (``/proc/PID/net/tcp``): which links a node's processes talk over."""
    def ip(field: str) -> str:
        return ".".join(str(b) for b in reversed(bytes.fromhex(field.split(":")[0])))
    with open(f"/proc/{pid}/net/tcp") as f:
        rows = [line.split() for line in f.read().splitlines()[1:]]
    return {(ip(r[1]), ip(r[2])) for r in rows if r[3] == "01"}


class Node:
    """One node's namespace: its address on the bridge, the host side of its link."""

    def __init__(self, net: "Network", name: str, index: int) -> None:
        self.name = name
        self.ns = f"{net.tag}-{name}"[:32]
        self.addr = f"{net.prefix}.{index + 1}"
        self.host_end = f"{net.tag}h{index}"[:15]
        _ip("ip", "netns", "add", self.ns)
        _ip("ip", "link", "add", self.host_end, "type", "veth", "peer", "name", IFACE, "netns", self.ns)
        _ip("ip", "link", "set", self.host_end, "master", net.bridge, "up")
        _ip("ip", "addr", "add", f"{self.addr}/24", "dev", IFACE, ns=self.ns)
        _ip("ip", "link", "set", IFACE, "up", ns=self.ns)
        _ip("ip", "link", "set", "lo", "up", ns=self.ns)

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this node's namespace."""
        return ["ip", "netns", "exec", self.ns, *argv]

    def cut(self) -> None:
        """Its link down: nothing in or out (no FIN, no RST: as a machine whose network went)."""
        _ip("ip", "link", "set", self.host_end, "down")

    def mend(self) -> None:
        _ip("ip", "link", "set", self.host_end, "up")

    def limit(self, mbit: float) -> None:
        """Its egress rate limited to ``mbit`` Mbit/s (both ways: the host side too)."""
        rate = f"{mbit:g}mbit"
        _ip("tc", "qdisc", "replace", "dev", IFACE, "root", "tbf", "rate", rate, "burst", "64kb", "latency", "400ms",
            ns=self.ns)
        _ip("tc", "qdisc", "replace", "dev", self.host_end, "root", "tbf", "rate", rate, "burst", "64kb",
            "latency", "400ms")

    def unlimit(self) -> None:
        for args, ns in ((("tc", "qdisc", "del", "dev", IFACE, "root"), self.ns),
                         (("tc", "qdisc", "del", "dev", self.host_end, "root"), None)):
            try:
                _ip(*args, ns=ns)
            except OSError:
                pass  # (none was set)

    def close(self) -> None:
        for args in (("ip", "link", "del", self.host_end), ("ip", "netns", "del", self.ns)):
            try:
                _ip(*args)
            except OSError:
                pass


class Network:
    """A bridge with an address for this machine (``addr``: how the test reaches the nodes) and
    the nodes made on it (``node``). ``close`` removes everything it made."""

    def __init__(self) -> None:
        k = next(_SUBNETS)
        self.tag = f"lv{os.getpid() % 10000}x{k}"
        self.prefix = f"10.{200 + k % 50}.{os.getpid() % 250}"
        self.bridge = f"{self.tag}br"[:15]
        self.addr = f"{self.prefix}.254"
        self.nodes: dict[str, Node] = {}
        _ip("ip", "link", "add", self.bridge, "type", "bridge")
        try:
            _ip("ip", "addr", "add", f"{self.addr}/24", "dev", self.bridge)
            _ip("ip", "link", "set", self.bridge, "up")
        except OSError:
            self.close()
            raise

    def node(self, name: str) -> Node:
        if name not in self.nodes:
            self.nodes[name] = Node(self, name, len(self.nodes))
        return self.nodes[name]

    def close(self) -> None:
        for n in self.nodes.values():
            n.close()
        self.nodes.clear()
        try:
            _ip("ip", "link", "del", self.bridge)
        except OSError:
            pass


__all__ = ["IFACE", "Network", "Node", "tcp_peers", "unavailable"]
