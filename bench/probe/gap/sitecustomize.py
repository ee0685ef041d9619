"""Where a LiveR worker's time between two steps goes: put this folder first on PYTHONPATH and every
worker times, per step, the pieces of its loop between one step's end and the next step's start,
and its courier's work; each process appends JSON lines to $GAP_PROBE_OUT/gap-PID.jsonl every 10
steps. A probe, not product code (a worker ends by os._exit: nothing is written at exit).

    PYTHONPATH=$PWD/bench/probe/gap:$PWD GAP_PROBE_OUT=/tmp/gap liver bench overhead ...
"""
import json
import os
import time

OUT = os.environ.get("GAP_PROBE_OUT")

if OUT:
    import liver.runtime.member as member
    from liver.engine.native import engine as native
    from liver.engine.native import step as native_step
    from liver.runtime import courier

    rows: list[dict] = []
    cur: dict = {}
    now = time.perf_counter

    def timed(cls, name, key):
        f = getattr(cls, name)

        def wrapper(*a, **kw):
            t0 = now()
            try:
                return f(*a, **kw)
            finally:
                cur[key] = cur.get(key, 0.0) + now() - t0
                cur[key + "_end"] = now()
        setattr(cls, name, wrapper)

    timed(member.Member, "after_step", "after_step")
    timed(member.Member, "boundary", "boundary")
    timed(courier.Courier, "post", "post")
    timed(courier.Courier, "wish", "wish")
    timed(native.NativeEngine, "drop_grads", "drop_grads")
    timed(native.NativeEngine, "finish", "finish")
    send = courier.Courier._send

    def timed_send(self, store, post):
        t0 = now()
        cur["send_lag"] = t0 - cur.get("post_end", t0)  # posted, until its thread got to it (the GIL)
        send(self, store, post)
        cur["send"] = now() - t0
    courier.Courier._send = timed_send
    agree = member.agree

    def timed_agree(*a, **kw):
        t0 = now()
        try:
            return agree(*a, **kw)
        finally:
            cur["agree"] = now() - t0
    member.agree = timed_agree

    init = native_step.NativeStep.__init__

    def step_init(self, engine):
        t = now()
        if "finish_end" in cur:
            cur["gap"] = t - cur["finish_end"]  # this step's start after the last one's finish
            rows.append(dict(cur, step=engine.step))
            if len(rows) >= 10:
                with open(os.path.join(OUT, f"gap-{os.getpid()}.jsonl"), "a") as f:
                    f.writelines(json.dumps({k: v for k, v in r.items() if not k.endswith("_end")}) + "\n"
                                 for r in rows)
                rows.clear()
        cur.clear()
        init(self, engine)
    native_step.NativeStep.__init__ = step_init
