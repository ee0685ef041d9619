"""64 clients of one TCPStore constructed at once (threads), against 64 raw TCP connects to the same port, with
the libuv server and the classic one: the slowest connect of each (this machine's 5 s stalls)."""
import socket
import threading
import time
from datetime import timedelta

import torch.distributed as dist

N = 64
for uv in (True, False):
    m = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60), wait_for_workers=False, use_libuv=uv)
    took: dict[str, list[float]] = {"store": [], "raw": []}

    def store(_):
        t0 = time.time()
        dist.TCPStore("127.0.0.1", m.port, is_master=False, timeout=timedelta(seconds=60), wait_for_workers=False,
                      use_libuv=uv)
        took["store"].append(time.time() - t0)

    def raw(_):
        t0 = time.time()
        s = socket.create_connection(("127.0.0.1", m.port))
        took["raw"].append(time.time() - t0)
        time.sleep(1)
        s.close()

    for kind, fn in (("raw", raw), ("store", store)):
        th = [threading.Thread(target=fn, args=(i,)) for i in range(N)]
        [t.start() for t in th]
        [t.join() for t in th]
    st = sorted(took["store"])
    print(f"libuv={uv}: {N} store clients at once: slowest {st[-1]:.3f} s, median {st[N // 2]:.3f} s; "
          f"{N} raw TCP connects: slowest {max(took['raw']):.4f} s", flush=True)
