"""The commands that talk to a running job through its control endpoint: ``liver status``,
``liver stop``, ``liver scale``, ``liver queue``. They import no torch (they answer in a fraction
of a second); the job's answer is JSON on stdout, a refusal goes to stderr with exit 1."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

def _endpoint(args: argparse.Namespace) -> tuple[str, str | None]:
    """The running job's control endpoint and token: from --url/--token, or the run's control.json."""
    url, token = args.url, args.token
    if args.run_dir:
        info_path = Path(args.run_dir) / "control.json"
        try:
            info = json.loads(info_path.read_text())
            url, token = url or info["url"], token or info["token"]
        except FileNotFoundError:
            raise ValueError(f"--run-dir {args.run_dir}: no control.json there (not a run directory, or its "
                             "job has no control endpoint)") from None
        except (OSError, ValueError, KeyError, TypeError):
            raise ValueError(f"--run-dir {args.run_dir}: control.json is unreadable or not the job's") from None
    if not url:
        raise ValueError("--run-dir or --url: the controller to talk to")
    return url, token


def _call(args: argparse.Namespace, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    from liver.controller.endpoint import request

    url, token = _endpoint(args)
    try:
        return request(url, token, method, path, body)
    except OSError as e:  # connection refused, timed out: the job has ended or is not reachable
        raise ValueError(f"the job's control endpoint at {url} does not answer ({e.__class__.__name__}: "
                         "the job may have ended)") from None


def _answer(code: int, body: dict, ok: tuple[int, ...]) -> int:
    """The job's answer: JSON on stdout; a refusal on stderr, with the job's reason, exit 1."""
    if code in ok:
        print(json.dumps(body))
        return 0
    print(f"liver: the job refused ({code}): {body.get('error', json.dumps(body))}", file=sys.stderr)
    return 1


def _status(args: argparse.Namespace) -> int:
    code, body = _call(args, "GET", "/status")
    if args.json or code != 200:
        return _answer(code, body, (200,))
    par = body.get("parallel") or {}
    print(f"{body['mode']}: phase {body['phase']}, generation {body['generation']}"
          + (f" (tp {par['tp']}, pp {par['pp']}, dp {par['dp']})" if par else "")
          + f", step {body['step']}, {body['queued']} queued")
    ck = body.get("checkpoint")
    if ck is not None:
        print("  checkpoint: " + (f"newest good of step {ck['step']}" if ck["step"] is not None else "none stands")
              + (f"; {ck['failures_in_a_row']} failed in a row since ({ck['error']})" if ck["failures_in_a_row"] else ""))
    for n in body.get("nodes", []):
        ranks = ", ".join(f"rank {r}: proc {p}" for r, p in n["ranks"]) or "no rank"
        print(f"  node {n['node']:<16} {'up' if n['up'] else 'LOST'}{' (notice)' if n['notice'] else ''}  "
              f"slots {n['slots'][0]}-{n['slots'][-1]}  {ranks}")
    return 0


def _stop(args: argparse.Namespace) -> int:
    return _answer(*_call(args, "POST", "/end", {"after": args.after}), (202,))


def _scale(args: argparse.Namespace) -> int:
    return _answer(*_call(args, "POST", "/scale", {"action": " ".join(args.action)}), (202,))


def _queue(args: argparse.Namespace) -> int:
    if args.withdraw is not None:
        code, body = _call(args, "POST", "/withdraw", {"position": args.withdraw})
    else:
        code, body = _call(args, "GET", "/queue")
    return _answer(code, body, (200, 202))



def add_parsers(sub) -> None:
    """``liver status``, ``stop``, ``scale``, ``queue``."""
    st = sub.add_parser("status", help="a running job: its phase, generation, nodes and which ranks they hold")
    st.add_argument("--run-dir", default=None, help="the run's directory (reads control.json)")
    st.add_argument("--url", default=None)
    st.add_argument("--token", default=None)
    st.add_argument("--json", action="store_true")
    st.set_defaults(fn=_status)
    so = sub.add_parser("stop", help="end a running job after N more steps (an event in flight finishes first)")
    so.add_argument("--after", type=int, default=0, metavar="N", help="steps to train before the end (default 0)")
    so.add_argument("--run-dir", default=None, help="the run's directory (reads control.json)")
    so.add_argument("--url", default=None)
    so.add_argument("--token", default=None)
    so.set_defaults(fn=_stop)
    sc = sub.add_parser("scale", help="send an event to a running `liver run`")
    sc.add_argument("action", nargs="+", help="scale-out N [as P] | scale-in N [deadline Ds] [as P] | reshape P")
    sc.add_argument("--run-dir", default=None, help="the run's directory (reads control.json)")
    sc.add_argument("--url", default=None)
    sc.add_argument("--token", default=None)
    sc.set_defaults(fn=_scale)
    q = sub.add_parser("queue", help="list the events a running `liver run` has queued, or withdraw one")
    q.add_argument("--withdraw", type=int, default=None, metavar="N", help="take back the N-th queued event")
    q.add_argument("--run-dir", default=None, help="the run's directory (reads control.json)")
    q.add_argument("--url", default=None)
    q.add_argument("--token", default=None)
    q.set_defaults(fn=_queue)


__all__ = ["add_parsers"]
