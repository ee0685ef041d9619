"""Where a node learns it is going: each source a small watcher (``Watcher``) the agent asks at
every sync whether a notice came, and that passes it on once (``liver.protocol.agent.Notice``).

- ``sigterm``: SIGTERM with a grace period (Kubernetes, Slurm: the processes get SIGTERM, then
  SIGKILL when the grace period is over);
- ``aws``: the EC2 spot ``instance-action`` metadata (IMDSv2, two minutes' notice);
- ``gcp``: the Compute Engine ``preempted`` metadata (30 s);
- ``azure``: Azure Scheduled Events of type ``Preempt`` (30 s at least);
- ``hook``: a file that appears, or ``POST /notice`` to the agent (anything else).

The metadata watchers poll from a thread of their own (a slow metadata server never holds the
agent's sync back); their base address can be set, for the tests' fake servers on loopback.
"""

from __future__ import annotations

import argparse
import threading
import time

from liver.protocol.agent import Notice


class Watcher:
    """Polls ``check()`` every ``poll_s`` from a thread of its own, once ``start()``ed; the agent
    calls the watcher itself, which returns the notice once one was seen (None until then)."""

    source = "?"

    def __init__(self, poll_s: float = 2.0) -> None:
        self.poll_s = poll_s
        self._notice: Notice | None = None
        self._stop = threading.Event()
        self.errors = 0  # checks that failed (a metadata server that does not answer)

    def check(self) -> Notice | None:
        raise NotImplementedError

    def start(self) -> "Watcher":
        threading.Thread(target=self._loop, name=f"notice-{self.source}", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set() and self._notice is None:
            try:
                self._notice = self.check()
            except (OSError, ValueError):  # not on that cloud, or its server is down: ask again
                self.errors += 1
            self._stop.wait(self.poll_s)

    def __call__(self) -> Notice | None:
        return self._notice


def seconds_until(when: float, now: float | None = None) -> float:
    """A provider's deadline as seconds from now (0 if it already passed)."""
    return max(0.0, when - (time.time() if now is None else now))


def add_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("preemption notices (each source a watcher; several may be on)")
    g.add_argument("--notice-sigterm", type=float, metavar="GRACE_S", default=None,
                   help="SIGTERM is a notice with this grace period (Kubernetes' terminationGracePeriodSeconds, "
                        "Slurm's KillWait); the workers ignore SIGTERM")
    g.add_argument("--notice-aws", action="store_true", help="poll the EC2 spot instance-action metadata")
    g.add_argument("--notice-gcp", action="store_true", help="poll the Compute Engine preempted metadata")
    g.add_argument("--notice-azure", action="store_true", help="poll Azure Scheduled Events for Preempt")
    g.add_argument("--notice-file", metavar="PATH", default=None,
                   help="a notice when PATH appears (its content: the seconds left; default --notice-default-s)")
    g.add_argument("--notice-http", type=int, metavar="PORT", default=None,
                   help="serve POST /notice {\"deadline_s\": N} on loopback PORT (the job's token)")
    g.add_argument("--notice-default-s", type=float, default=30.0,
                   help="the deadline of a notice that names none (default 30 s)")
    g.add_argument("--metadata-url", default=None, help="the metadata server's base URL (tests; default the cloud's)")


def watchers(args: argparse.Namespace) -> list[Watcher]:
    """The watchers the agent's flags ask for, started."""
    from liver.agent.notices import aws, azure, gcp, hook, sigterm

    default = args.notice_default_s
    if not 0 < default <= 86400:
        raise ValueError(f"--notice-default-s={default!r}: allowed more than 0 up to 86400 s")
    out: list[Watcher] = []
    if args.notice_sigterm is not None:
        out.append(sigterm.SigtermWatcher(args.notice_sigterm))
    base = args.metadata_url
    if args.notice_aws:
        out.append(aws.AwsSpotWatcher(base or aws.BASE))
    if args.notice_gcp:
        out.append(gcp.GcpPreemptedWatcher(base or gcp.BASE, deadline_s=default))
    if args.notice_azure:
        out.append(azure.AzurePreemptWatcher(base or azure.BASE, default_s=default))
    if args.notice_file:
        out.append(hook.FileWatcher(args.notice_file, default_s=default))
    if args.notice_http is not None:
        try:
            out.append(hook.HttpHook(args.notice_http, args.token, default_s=default))
        except OSError as e:  # (the port taken, or not this user's to bind)
            raise ValueError(f"--notice-http={args.notice_http}: cannot serve there ({e})") from None
    return [w.start() for w in out]
