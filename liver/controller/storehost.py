"""The job's store in a process of its own (``liver controller``): the workers keep their store
while the controller is down, and a controller that comes back (``liver controller --resume``)
finds every key where it was. It ends when the job does (``STOP_KEY``), or once no controller
has said it is alive (``ALIVE_KEY``) for ``orphan_timeout_s``.

    python -m liver.controller.storehost --host H --port P --ready FILE
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import liver.protocol.secret as job_secret

STOP_KEY = "storehost/stop"
ALIVE_KEY = "storehost/alive"   # the controller's time, every second


def start(run_dir: Path, host: str, port: int, secret: bytes, advertise: str | None = None,
          timeout_s: float = 60.0) -> tuple[int, str]:
    """A store host for the job, in a session of its own (a controller killed with its process
    group leaves it be), told the job's ``secret`` (its keys, the controller's among them, are
    under the job's prefix: ``protocol.store.run_store``); returns its pid and the address its
    clients use."""
    ready = run_dir / "store.json"
    ready.unlink(missing_ok=True)
    log = open(run_dir / "store.log", "ab")
    try:
        p = subprocess.Popen([sys.executable, "-m", "liver.controller.storehost", "--host", host, "--port", str(port),
                              "--ready", str(ready), *(["--advertise", advertise] if advertise else [])],
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                             env=dict(os.environ, **job_secret.env(secret)))
    finally:
        log.close()
    end = time.time() + timeout_s
    while not ready.exists():
        if p.poll() is not None or time.time() > end:
            raise RuntimeError(f"the job's store did not start on {host}:{port or 'a free port'}: "
                               f"{(run_dir / 'store.log').read_text()[-800:]}")
        time.sleep(0.05)
    info = json.loads(ready.read_text())
    return info["pid"], info["addr"]


def serve(host: str, port: int, ready: Path, orphan_timeout_s: float, advertise: str | None = None) -> None:
    from liver.protocol.store import run_store
    from liver.world.world import make_store

    store, addr = make_store(timeout_s=600.0, host=host, port=port, advertise=advertise)
    run = run_store(store, job_secret.from_env())
    tmp = ready.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "addr": addr}))
    os.replace(tmp, ready)
    run.set(ALIVE_KEY, str(time.time()))
    while not run.check([STOP_KEY]):
        if time.time() - float(run.get(ALIVE_KEY)) > orphan_timeout_s:
            print(f"no controller for {orphan_timeout_s:g} s: the job's store ends", flush=True)
            return
        time.sleep(1.0)


def main() -> None:
    p = argparse.ArgumentParser(prog="liver.controller.storehost")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ready", required=True)
    p.add_argument("--orphan-timeout", type=float, default=3600.0)
    p.add_argument("--advertise", default=None)
    a = p.parse_args()
    serve(a.host, a.port, Path(a.ready), a.orphan_timeout, a.advertise)


if __name__ == "__main__":
    main()
