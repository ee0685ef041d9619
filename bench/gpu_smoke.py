"""GPU smoke run of the foundation (issue 2, item 10), one call on a lent 2-GPU machine.

A: MFU of a ~1B-parameter model in bf16 on one GPU (tp=pp=dp=1).
B: the engine with NCCL at tp=2, then pp=2, then dp=2 (2 GPUs), reshaped between them by
   stop-and-restart through DCP; the state digest must match across each restart.
Writes $OUT/gpu_smoke.json.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch

from liver.engine.segment import run_segment
from liver.runtime.restart import stop_and_restart
from liver.world.world import make_store
from liver.topology import JobConfig, ModelConfig, ParallelConfig, TrainConfig

OUT = Path(os.environ.get("OUT", "/tmp/out"))
OUT.mkdir(parents=True, exist_ok=True)
report = {"torch": torch.__version__, "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
          "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
print(report, flush=True)

one_b = JobConfig(model=ModelConfig(num_layers=16, hidden_size=2048, num_heads=16, ffn_size=5632,
                                    vocab_size=50257, seq_len=2048, vocab_multiple=128),
                  train=TrainConfig(global_batch=16, micro_batch=4, warmup_steps=2, lr=3e-4, min_lr=3e-5),
                  compute_dtype="bfloat16")
store, addr = make_store()
torch.cuda.set_device(0)
t0 = time.time()
a = run_segment(store_addr=addr, namespace="mfu", rank=0, job=one_b.to_dict(), parallel=ParallelConfig().to_dict(),
                steps=int(os.environ.get("MFU_STEPS", "8")), backend="nccl", digests=False, log=True)
report["mfu_run"] = {"params": one_b.model.num_params(), "model": one_b.model.to_dict(),
                     "step_s": a["step_s"], "losses": a["losses"], "wall_s": time.time() - t0}
steady = sorted(a["step_s"][2:])[len(a["step_s"][2:]) // 2]
m = one_b.model
flops_tok = 6 * m.num_params() + 12 * m.num_layers * m.hidden_size * m.seq_len
tokens = one_b.train.global_batch * m.seq_len
report["mfu_run"]["median_step_s"] = steady
report["mfu_run"]["mfu_vs_989TF"] = flops_tok * tokens / steady / 989e12
print("MFU (median step):", report["mfu_run"]["mfu_vs_989TF"], flush=True)
del a
torch.cuda.empty_cache()

small = JobConfig(model=ModelConfig(num_layers=12, hidden_size=1024, num_heads=16, ffn_size=2816,
                                    vocab_size=50257, seq_len=1024, vocab_multiple=128),
                  train=TrainConfig(global_batch=16, micro_batch=4, warmup_steps=2, lr=3e-4, min_lr=3e-5),
                  compute_dtype="bfloat16")
configs = [ParallelConfig(tp=2), ParallelConfig(pp=2), ParallelConfig(dp=2)]
b = stop_and_restart(job=small, configs=configs, steps=4, workdir=Path("/tmp/liver-smoke"), backend="nccl")
report["restart_run"] = {"params": small.model.num_params(), "configs": [c.short() for c in configs], **b}
(OUT / "gpu_smoke.json").write_text(json.dumps(report, indent=1))
ok = all(ev["digest_equal"] for ev in b["events"])
print("digest equal across every DCP reshape:", ok)
for ev in b["events"]:
    print(ev)
sys.exit(0 if ok else 1)
