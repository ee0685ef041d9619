# 32 TCPStore clients of one store at once, from threads (argv: count, 1 for the libuv server or 0); the slow ones wait on reverse DNS lookups
# (strace -f -e trace=connect,poll,sendto shows the PTR query and poll(..., 5000) = 0 (Timeout))
import threading, time, sys, subprocess
from datetime import timedelta
import torch.distributed as dist
n=int(sys.argv[1]); libuv=sys.argv[2]=="1"
srv=dist.TCPStore("127.0.0.1",0,n+1,True,timeout=timedelta(seconds=60),wait_for_workers=False,use_libuv=libuv)
port=srv.port
print(subprocess.run(["ss","-lnt",f"sport = :{port}"],capture_output=True,text=True).stdout.strip().splitlines()[-1])
ts=[0.0]*n
def c(i):
    t0=time.time(); s=dist.TCPStore("127.0.0.1",port,n+1,False,timeout=timedelta(seconds=60),use_libuv=libuv); ts[i]=time.time()-t0
th=[threading.Thread(target=c,args=(i,)) for i in range(n)]
[t.start() for t in th]; [t.join() for t in th]
print(n, libuv, sum(x>1 for x in ts), sorted(round(x,2) for x in ts)[-3:])
