"""EC2 spot interruption: ``/latest/meta-data/spot/instance-action`` answers 404 until the
instance is to be interrupted, then ``{"action": "terminate"|"stop"|"hibernate", "time":
"2026-12-01T12:00:00Z"}``, two minutes ahead. IMDSv2: a session token first (``PUT
/latest/api/token``); an instance that allows only IMDSv1 answers the PUT with an error and is
asked without one."""

from __future__ import annotations

import datetime as dt
import json
import urllib.error
import urllib.request

from liver.agent.notices import Watcher, seconds_until
from liver.protocol.agent import Notice

BASE = "http://169.254.169.254"
TOKEN_TTL_S = 21600


class AwsSpotWatcher(Watcher):
    source = "aws spot instance-action"

    def __init__(self, base: str = BASE, poll_s: float = 2.0, timeout_s: float = 1.0) -> None:
        super().__init__(poll_s)
        self.base, self.timeout_s = base.rstrip("/"), timeout_s

    def _token(self) -> str | None:
        req = urllib.request.Request(self.base + "/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                return r.read().decode()
        except urllib.error.HTTPError:
            return None  # IMDSv1 only

    def check(self) -> Notice | None:
        token = self._token()
        req = urllib.request.Request(self.base + "/latest/meta-data/spot/instance-action",
                                     headers={"X-aws-ec2-metadata-token": token} if token else {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None  # no interruption scheduled
            raise
        when = dt.datetime.strptime(body["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
        return Notice(source=f"aws spot {body.get('action', 'terminate')}", deadline_s=seconds_until(when.timestamp()))
