"""SIGTERM as a preemption notice: Kubernetes sends it to the pod's processes, then SIGKILL after
``terminationGracePeriodSeconds``; Slurm sends it (``scancel``, a preemption, the time limit), then
SIGKILL after ``KillWait``. The agent takes it as a notice of that grace period and its workers
ignore it (``LIVER_WORKER_IGNORE_SIGTERM``), so the ranks can leave live before the SIGKILL."""

from __future__ import annotations

import os
import signal
import time

from liver.agent.notices import Watcher
from liver.protocol.agent import IGNORE_SIGTERM, Notice


class SigtermWatcher(Watcher):
    source = "SIGTERM"

    def __init__(self, grace_s: float) -> None:
        if not 0 < grace_s <= 86400:
            raise ValueError(f"--notice-sigterm={grace_s!r}: allowed a grace period of more than 0 up to 86400 s")
        super().__init__()
        self.grace_s = grace_s
        self.at: float | None = None

    def start(self) -> "SigtermWatcher":
        """The handler (in the main thread, as Python requires); the workers it starts ignore it."""
        signal.signal(signal.SIGTERM, self._on_term)
        os.environ[IGNORE_SIGTERM] = "1"
        return self

    def _on_term(self, *_: object) -> None:
        if self.at is None:
            self.at = time.time()
            self._notice = Notice(source="SIGTERM", deadline_s=self.grace_s)

    def stop(self) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
