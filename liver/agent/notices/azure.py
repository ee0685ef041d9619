"""Azure Scheduled Events: ``/metadata/scheduledevents?api-version=2020-07-01`` (header
``Metadata: true``) lists the events coming to the VM; a spot eviction is ``"EventType":
"Preempt"`` with ``NotBefore`` (an RFC 1123 date; 30 s ahead at least). Where ``vm`` is given,
only events naming it in their ``Resources`` count."""

from __future__ import annotations

import json
import urllib.request
from email.utils import parsedate_to_datetime

from liver.agent.notices import Watcher, seconds_until
from liver.protocol.agent import Notice

BASE = "http://169.254.169.254"
PATH = "/metadata/scheduledevents?api-version=2020-07-01"


class AzurePreemptWatcher(Watcher):
    source = "azure Preempt"

    def __init__(self, base: str = BASE, vm: str | None = None, default_s: float = 30.0, poll_s: float = 1.0,
                 timeout_s: float = 1.0) -> None:
        super().__init__(poll_s)
        self.base, self.vm, self.default_s, self.timeout_s = base.rstrip("/"), vm, default_s, timeout_s

    def check(self) -> Notice | None:
        req = urllib.request.Request(self.base + PATH, headers={"Metadata": "true"})
        with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
            doc = json.loads(r.read())
        for ev in doc.get("Events", []):
            if ev.get("EventType") != "Preempt":
                continue
            if self.vm is not None and self.vm not in ev.get("Resources", []):
                continue
            when = ev.get("NotBefore") or ""
            left = seconds_until(parsedate_to_datetime(when).timestamp()) if when else self.default_s
            return Notice(source=f"azure Preempt {ev.get('EventId', '')}".strip(), deadline_s=left)
        return None
