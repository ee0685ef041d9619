"""Does an expired Work.wait(timeout) on a gloo recv close its pair? Rank 1 waits 1 s on a recv
that rank 0 satisfies after 2.5 s; then one more send and recv on the same group."""
import os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
import torch.multiprocessing as mp

def run(rank):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29631", rank=rank, world_size=2,
                            timeout=timedelta(seconds=30))
    t = torch.zeros(4)
    if rank == 0:
        time.sleep(2.5)
        try:
            dist.send(torch.ones(4), 1); print("rank 0: first send done", flush=True)
            dist.send(torch.ones(4) * 2, 1); print("rank 0: second send done", flush=True)
        except RuntimeError as e:
            print("rank 0:", e, flush=True)
    else:
        w = dist.irecv(t, 0)
        try:
            w.wait(timedelta(seconds=1)); print("rank 1: waited", flush=True)
        except RuntimeError as e:
            print("rank 1: the 1 s wait raised:", str(e)[:120], flush=True)
        try:
            w.wait(); print("rank 1: then received", t.tolist(), flush=True)
            dist.recv(t, 0); print("rank 1: second recv", t.tolist(), flush=True)
        except RuntimeError as e:
            print("rank 1: afterwards:", str(e)[:160], flush=True)
    time.sleep(1)

if __name__ == "__main__":
    mp.spawn(run, nprocs=2)
