import threading, time
from datetime import timedelta
import torch.distributed as dist
srv = dist.TCPStore("127.0.0.1", 0, 1000, True, timeout=timedelta(seconds=60), wait_for_workers=False)
port = srv.port
while True:
    keep = []
    def c():
        try: keep.append(dist.TCPStore("127.0.0.1", port, 1000, False, timeout=timedelta(seconds=60)))
        except Exception: pass
    th = [threading.Thread(target=c) for _ in range(24)]; [t.start() for t in th]; [t.join() for t in th]
    del keep
    time.sleep(1.0)
