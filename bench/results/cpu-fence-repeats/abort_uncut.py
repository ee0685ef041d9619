"""The heal that never came, in isolation (issue 33): two gloo ranks, rank 1 never joins the second
all-reduce; on rank 0 the communicator is marked cut with no socket touched (a cut that did not wake
gloo), so its sliced wait raises; then the group is let go of. Since the fix the abort parks it at
once; let go of as before the fix, the release waits for gloo's all-reduce to time out (ARG s, the
group's timeout) in the thread that let go. Run: python abort_uncut.py 8 > abort_uncut.out"""
import multiprocessing as mp, os, sys, time, socket, threading, gc
from datetime import timedelta
import torch, torch.distributed as dist
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[3]))

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]

def rank(r, port, q, timeout_s):
    from liver.world.group import Group
    store = dist.TCPStore("127.0.0.1", port, 3, False, timeout=timedelta(seconds=60))
    g = Group.create(store, "g0", [0, 1], r, "gloo", torch.device("cpu"), timedelta(seconds=timeout_s))
    t = torch.ones(1 << 10)
    g.allreduce(t)
    q.put(("ready", r))
    if r == 1:
        time.sleep(600); return
    ticks = []
    def tick():
        while True:
            ticks.append(time.time()); time.sleep(0.1)
    threading.Thread(target=tick, daemon=True).start()
    threading.Timer(1.5, g.comm.cut.set).start()   # the mark alone: no socket touched
    t0 = time.time()
    try:
        g.allreduce(t)
    except Exception as e:
        q.put(("raised", type(e).__name__, str(e)[:60], round(time.time() - t0, 2)))
    t1 = time.time()
    from liver.world import group
    g.abort(); ta = time.time(); q.put(("abort (parks it)", round(ta - t1, 2), "parked", group.parked()))
    del g
    t1 = time.time()
    with group._PARKED_LOCK:
        group._PARKED.clear()  # what the abort did before the fix: let go of it with gloo still in the all-reduce
    gc.collect()
    t2 = time.time()
    q.put(("let go as before the fix", round(t2 - t1, 2), "ticks of another thread meanwhile",
           len([x for x in ticks if t1 < x < t2]), "of about", int((t2 - t1) / 0.1)))

if __name__ == "__main__":
    timeout_s = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, 3, True, timeout=timedelta(seconds=60), wait_for_workers=False)
    ctx = mp.get_context("spawn"); q = ctx.Queue()
    ps = [ctx.Process(target=rank, args=(r, port, q, timeout_s), daemon=True) for r in (0, 1)]
    for p in ps: p.start()
    for _ in range(5):
        try: print(q.get(timeout=60), flush=True)
        except Exception as e: print("timeout", type(e).__name__); break
    for p in ps: p.kill()
