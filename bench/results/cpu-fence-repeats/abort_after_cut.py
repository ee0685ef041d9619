import multiprocessing as mp, os, signal, sys, time, socket, threading
from datetime import timedelta
import torch, torch.distributed as dist
sys.path.insert(0, '/work/main')

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]

def rank(r, port, q):
    from liver.world.sever import sever
    from liver.world.group import Group
    store = dist.TCPStore("127.0.0.1", port, 3, False, timeout=timedelta(seconds=60))
    gs = [Group.create(store, f"g{k}", [0, 1], r, "gloo", torch.device("cpu"), timedelta(seconds=120)) for k in range(2)]
    t = torch.ones(1 << 20)
    for g in gs: g.allreduce(t)
    q.put(("ready", r, os.getpid()))
    if r == 1:
        time.sleep(600); return
    threading.Timer(1.0, lambda: q.put(("cut", sever({port}), 0))).start()
    ticks = []
    def tick():
        while True:
            ticks.append(time.time()); time.sleep(0.2)
    threading.Thread(target=tick, daemon=True).start()
    t0 = time.time()
    try:
        gs[0].allreduce(t)
    except RuntimeError as e:
        q.put(("raised", str(e)[:60], round(time.time() - t0, 2)))
    t1 = time.time()
    for g in gs:
        g.abort()
    import gc; gc.collect()
    n = len([x for x in ticks if x > t1])
    q.put(("aborted", round(time.time() - t1, 2), n))

if __name__ == "__main__":
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, 3, True, timeout=timedelta(seconds=60), wait_for_workers=False)
    ctx = mp.get_context("spawn"); qs = [ctx.Queue(), ctx.Queue()]
    ps = [ctx.Process(target=rank, args=(r, port, qs[r]), daemon=True) for r in (0, 1)]
    for p in ps: p.start()
    pids = {}
    for q in qs:
        w, r, pid = q.get(timeout=60); pids[r] = pid
    os.kill(pids[1], signal.SIGSTOP)
    try:
        for _ in range(3): print(qs[0].get(timeout=30))
    except Exception as e: print("timeout", type(e).__name__)
    for p in ps: os.kill(p.pid, signal.SIGKILL)
