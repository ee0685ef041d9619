"""``liver bench host-copy``: a GPU's copies to and from pinned host memory, what a restart from
host memory pays for each rank's state (the snapshot down, the load back up): one direction at a
time, and both at once on two streams (a host link carries both ways together). Sizes well beyond
the caches; per size, the median of ``--repeats`` timed copies after two untimed ones, the
directions interleaved.

    liver bench host-copy --mib 256,1024 --out FILE
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any


def _timed(fn, sync, repeats: int) -> float:
    times = []
    for i in range(repeats + 2):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        if i >= 2:  # (the first two: first use)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(mibs: list[int], repeats: int = 10) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        raise ValueError("liver bench host-copy: this machine has no GPU (it measures a GPU's host link)")
    if not mibs or any(not 1 <= m <= 65536 for m in mibs) or repeats < 1:
        raise ValueError(f"--mib={mibs!r}: allowed sizes of 1 to 65536 MiB; --repeats={repeats}: at least 1")
    dev = torch.device("cuda", torch.cuda.current_device())
    rows = []
    for mib in mibs:
        n = mib << 20
        host_a = torch.empty(n, dtype=torch.uint8, pin_memory=True).fill_(1)
        host_b = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        dev_a = torch.empty(n, dtype=torch.uint8, device=dev).fill_(2)
        dev_b = torch.empty(n, dtype=torch.uint8, device=dev)
        up, down = torch.cuda.Stream(dev), torch.cuda.Stream(dev)

        def sync() -> None:
            torch.cuda.synchronize(dev)

        def both() -> None:
            with torch.cuda.stream(up):
                dev_b.copy_(host_a, non_blocking=True)
            with torch.cuda.stream(down):
                host_b.copy_(dev_a, non_blocking=True)

        h2d = _timed(lambda: dev_b.copy_(host_a, non_blocking=True), sync, repeats)
        d2h = _timed(lambda: host_b.copy_(dev_a, non_blocking=True), sync, repeats)
        two = _timed(both, sync, repeats)
        rows.append({"mib": mib, "h2d_GBps": n / h2d / 1e9, "d2h_GBps": n / d2h / 1e9,
                     # each direction's bytes over the time both took: what either gets while both run
                     "both_each_GBps": n / two / 1e9, "both_over_one": two / max(h2d, d2h)})
        del host_a, host_b, dev_a, dev_b
    return {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(dev), "repeats": repeats, "rows": rows}


def main(args) -> int:
    result = run([int(x) for x in str(args.mib).split(",")], args.repeats)
    for r in result["rows"]:
        print(f"{r['mib']:>6} MiB: to the GPU {r['h2d_GBps']:.1f} GB/s, to the host {r['d2h_GBps']:.1f} GB/s, "
              f"both at once {r['both_each_GBps']:.1f} GB/s each ({r['both_over_one']:.2f}x one's time)")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


__all__ = ["run", "main"]
