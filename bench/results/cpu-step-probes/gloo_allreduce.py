import os, time, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, n):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29544")
    dist.init_process_group("gloo", rank=rank, world_size=n)
    t = torch.ones(64)
    for _ in range(20): dist.all_reduce(t)
    t0 = time.perf_counter(); c0 = time.process_time()
    for _ in range(500): dist.all_reduce(t)
    dt = time.perf_counter() - t0; dc = time.process_time() - c0
    if rank == 0: print(n, "ranks: per allreduce", round(dt/500*1e3, 3), "ms wall,", round(dc/500*1e3,3), "ms cpu (all threads)")
    dist.destroy_process_group()
if __name__ == "__main__":
    import sys
    n = int(sys.argv[1]); mp.spawn(run, args=(n,), nprocs=n)
