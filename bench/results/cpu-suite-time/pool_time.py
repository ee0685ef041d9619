"""The tests' WorkerPool: eight workers started and a first call on each (session of 2026-12-04, second).
Run from the repository root: PYTHONPATH=. OMP_NUM_THREADS=1 python bench/results/cpu-suite-time/pool_time.py"""
import time

from liver.launch import WorkerPool


def noop(**kw):
    import torch  # noqa: F401
    return 1


if __name__ == "__main__":
    from pool_time import noop as fn  # (by module name: the workers import it)
    t = time.time()
    with WorkerPool(8) as p:
        p.run(fn, [{}] * 8, timeout=60)
        print("first run", round(time.time() - t, 2))
