"""``liver agent``: a node agent offering this node's slots to a job's controller
(``liver.agent.service``). Registered by ``add_parsers``; the agent's modules are imported when
the command runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from liver.host import gpus


def _agent(args: argparse.Namespace) -> int:
    import os

    from liver import logs
    from liver.agent.notices import watchers
    from liver.agent.service import AgentService, ControllerGone
    from liver.host.threads import check_threads

    check_threads()  # (its workers' thread count: refused before any of them starts)
    _check(args)
    slots = args.slots or _env_slots() or gpus.slots(args.backend)
    use_interface(args.iface)
    url, token = args.controller or os.environ.get("LIVER_CONTROLLER"), args.token or os.environ.get("LIVER_TOKEN")
    resolve = None
    if args.run_dir and not url:
        url, token = _await_control(Path(args.run_dir), args.connect_timeout, token)
        resolve = lambda: _control(Path(args.run_dir))[0]  # noqa: E731  (a controller that moved)
    if not url:
        raise ValueError("--controller HOST:PORT (or LIVER_CONTROLLER, or --run-dir of the controller's run): "
                         "the controller to join")
    if not token:
        raise ValueError("--token (or LIVER_TOKEN): the job's token, from the controller's control.json")
    node = args.node or os.environ.get("LIVER_NODE") or os.environ.get("SLURMD_NODENAME") \
        or os.environ.get("HOSTNAME") or None
    logs.setup()
    svc = AgentService(url, token, slots, node=node, connect_timeout_s=args.connect_timeout, quiet=not args.verbose,
                       resolve=resolve)
    # (started once every flag was checked; with the job's token as found: --run-dir's control.json too)
    svc.notices = watchers(argparse.Namespace(**{**vars(args), "token": token}))
    try:
        return svc.run()
    except ControllerGone as e:  # (no traceback: the operator's to act on)
        print(f"liver: agent: {e}", file=sys.stderr)
        return 1


def _check(args: argparse.Namespace) -> None:
    """The flags a node agent is given, each refused by name before anything starts."""
    from liver.agent.config import MAX_SLOTS

    if args.slots is not None and not 1 <= args.slots <= MAX_SLOTS:
        raise ValueError(f"--slots={args.slots}: allowed 1 to {MAX_SLOTS} worker slots")
    if not 0 < args.connect_timeout <= 86400:
        raise ValueError(f"--connect-timeout={args.connect_timeout:g}: allowed more than 0 up to 86400 s")
    if args.notice_http is not None and not 1 <= args.notice_http <= 65535:
        raise ValueError(f"--notice-http={args.notice_http}: allowed a port from 1 to 65535")


def _env_slots() -> int:
    """LIVER_SLOTS, where set (0: unset)."""
    import os

    from liver.agent.config import MAX_SLOTS

    text = os.environ.get("LIVER_SLOTS", "").strip()
    if not text:
        return 0
    if not text.isdigit() or not 1 <= int(text) <= MAX_SLOTS:
        raise ValueError(f"LIVER_SLOTS={text!r}: allowed 1 to {MAX_SLOTS} worker slots")
    return int(text)


def use_interface(iface: str | None) -> None:
    """``--iface``: the network interface its workers' gloo and NCCL connections use (for the
    workers: GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, where not set already). Refused, naming the
    flag, where this machine has no such interface."""
    import os
    import socket

    if iface is None:
        return
    names = sorted(n for _, n in socket.if_nameindex())
    if iface not in names:
        raise ValueError(f"--iface {iface!r}: no such network interface here; allowed: {', '.join(names)}")
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        os.environ.setdefault(var, iface)


def _await_control(run_dir: Path, timeout_s: float, token: str | None) -> tuple[str, str]:
    """The controller's URL and token from its run directory's control.json, once it is there."""
    import time

    end, said = time.time() + timeout_s, False
    while True:
        try:
            url, mine = _control(run_dir)
            return url, token or mine
        except (OSError, ValueError, KeyError, TypeError):
            if not said:
                print(f"[liver] agent: no controller's control.json in {run_dir} yet; waiting for it "
                      f"({timeout_s:g} s left)", flush=True)
                said = True
            if time.time() > end:
                raise ValueError(f"--run-dir {run_dir}: no controller's control.json there within {timeout_s:g} s") \
                    from None
            time.sleep(0.2)


def _control(run_dir: Path) -> tuple[str, str]:
    """The controller's URL and token as its control.json says now (OSError, ValueError, KeyError)."""
    info = json.loads((run_dir / "control.json").read_text())
    return info["url"], info["token"]


def add_parsers(sub) -> None:
    """``liver agent``."""
    a = sub.add_parser("agent", help="a node agent: offers this node's slots to a job's controller")
    a.add_argument("--controller", default=None, metavar="HOST:PORT",
                   help="the controller's endpoint (default: LIVER_CONTROLLER)")
    a.add_argument("--run-dir", default=None, help="instead: the controller's run directory (its control.json, read "
                                                  "again whenever the controller is lost: one that moved is found)")
    a.add_argument("--token", default=None, help="the job's token (default: LIVER_TOKEN, or control.json)")
    a.add_argument("--slots", type=int, default=None,
                   help="worker slots (default: LIVER_SLOTS, or the GPU count on NCCL, 4 on CPU)")
    a.add_argument("--backend", default="gloo", help="where --slots is unset: nccl counts the GPUs")
    a.add_argument("--node", default=None, help="this node's name in the job (default: LIVER_NODE, "
                                                "SLURMD_NODENAME, HOSTNAME, or host-pid)")
    a.add_argument("--connect-timeout", type=float, default=300.0, help="seconds to wait for the controller")
    a.add_argument("--verbose", action="store_true", help="worker output to the terminal too")
    a.add_argument("--iface", default=None, help="the network interface its workers' gloo and NCCL connections "
                                                 "use (default: GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, else "
                                                 "the interface of this host's name)")
    from liver.agent.notices import add_flags
    add_flags(a)
    a.set_defaults(fn=_agent)


__all__ = ["add_parsers"]
