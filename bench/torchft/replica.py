"""One torchft replica group (one process) of the side-by-side kill: the same 12.6M-parameter
Llama-style model as ``liver bench heal`` (examples/llama.py at its shape), AdamW, 4 sequences of
64 tokens a step, gloo on CPU, torchft's Manager (gradients all-reduced through it) and its optimizer wrapper.

Run by ``bench/torchft/side_by_side.py`` with an interpreter that has torchft 0.2.0:
    python replica.py --replica R --lighthouse URL --store-port P --steps N --out FILE

Each step writes one JSON line: the Manager's step after it, whether it committed, the number of
participants in its quorum, its wall time and when it ended.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.distributed import TCPStore

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[2] / "examples")]
from llama import Llama  # noqa: E402  (the project's plain-torch model; no LiveR at run time)

from torchft import Manager, Optimizer, ProcessGroupGloo  # noqa: E402


def main() -> None:
    a = argparse.ArgumentParser()
    a.add_argument("--replica", type=int, required=True)
    a.add_argument("--lighthouse", required=True)
    a.add_argument("--store-port", type=int, required=True)
    a.add_argument("--steps", type=int, required=True)
    a.add_argument("--out", required=True)
    args = a.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same initial model on every replica
    model = Llama(vocab=8192, dim=256, layers=8, heads=8, hidden=1024)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)
    store = TCPStore("127.0.0.1", args.store_port, world_size=1, is_master=True, wait_for_workers=False)

    def state_dict():
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])

    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=10)), load_state_dict=load_state_dict,
                      state_dict=state_dict, min_replica_size=1, replica_id=f"replica{args.replica}",
                      lighthouse_addr=args.lighthouse, store_addr="127.0.0.1", store_port=args.store_port,
                      rank=0, world_size=1, timeout=timedelta(seconds=10), quorum_timeout=timedelta(seconds=30),
                      connect_timeout=timedelta(seconds=30))
    # the gradients all-reduced as one flat buffer through the Manager (as DDP with one bucket):
    # torchft 0.2.0's DDP wrapper fails on the buckets after one that errored (its hook asserts
    # ``fut._fut`` on the no-op work the Manager returns once errored), killing the survivor
    optim = Optimizer(manager, opt)
    params = list(model.parameters())
    g = torch.Generator().manual_seed(1000 + args.replica)
    out = open(args.out, "a", buffering=1)
    while manager.current_step() < args.steps:
        t0 = time.perf_counter()
        tokens = torch.randint(0, 8192, (4, 65), generator=g)
        optim.zero_grad()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        manager.allreduce(flat).wait()  # the average over the quorum's participants
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        before = manager.current_step()
        optim.step()
        out.write(json.dumps({"step": manager.current_step(), "committed": manager.current_step() > before,
                              "participants": manager.num_participants(), "step_s": time.perf_counter() - t0,
                              "time": time.time(), "loss": float(loss), "pid": os.getpid()}) + "\n")
    out.close()
    manager.shutdown(wait=False)
    del store  # (the replica group's store lives as long as its Manager)


if __name__ == "__main__":
    main()
