"""Compute Engine preemption (spot and preemptible VMs): ``/computeMetadata/v1/instance/preempted``
answers ``FALSE`` until the VM is preempted, then ``TRUE``; the VM then has 30 s before it stops.
Every request carries ``Metadata-Flavor: Google``."""

from __future__ import annotations

import urllib.request

from liver.agent.notices import Watcher
from liver.protocol.agent import Notice

BASE = "http://metadata.google.internal"
GCP_NOTICE_S = 30.0


class GcpPreemptedWatcher(Watcher):
    source = "gcp preempted"

    def __init__(self, base: str = BASE, deadline_s: float = GCP_NOTICE_S, poll_s: float = 1.0,
                 timeout_s: float = 1.0) -> None:
        super().__init__(poll_s)
        self.base, self.deadline_s, self.timeout_s = base.rstrip("/"), deadline_s, timeout_s

    def check(self) -> Notice | None:
        req = urllib.request.Request(self.base + "/computeMetadata/v1/instance/preempted",
                                     headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
            value = r.read().decode().strip().upper()
        if value not in ("TRUE", "FALSE"):
            raise ValueError(f"gcp preempted: unexpected answer {value[:40]!r}")
        return Notice(source=self.source, deadline_s=self.deadline_s) if value == "TRUE" else None
