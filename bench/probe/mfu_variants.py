"""The example's plain loop at 1B on one GPU, variants side by side (step time, MFU), and where a
step's device time goes (torch.profiler): ``python3 bench/probe/mfu_variants.py OUT_DIR``."""
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from liver.bench.overhead import PlainSteps
from liver.config.jobfile import build, override
from liver.engine.flops import mfu, peak_flops
from liver.engine.interface import load_adapter

out = Path(sys.argv[1])
cfg = build({"preset": "1b", "engine": "examples/llama.py:RECIPE"}, override("job.train.global_batch=8"))
job, recipe = cfg.job, load_adapter(cfg.engine).recipe
dev = torch.device("cuda", 0)
rows = {}


def variant(name, optimizer=None, criterion=None, steps=14):
    r = type(recipe)()
    if optimizer:
        r.optimizer = optimizer
    if criterion:
        r.criterion = criterion
    it = PlainSteps(r, job, steps, dev)
    r.loop(it)
    iv = [b - a for a, b in zip(it.ends[4:], it.ends[5:])]
    m = statistics.median(iv)
    rows[name] = {"median_step_s": m, "mfu": mfu(load_adapter(cfg.engine).facts(job).flops_per_token, 8 * 2048 / m,
                                                  peak_flops(dev, "bfloat16"), 1)}
    print(name, rows[name], flush=True)
    del it
    import gc
    gc.collect()
    torch.cuda.empty_cache()


def fused(model, job):
    t = job.train
    return torch.optim.AdamW(model.parameters(), lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps,
                             weight_decay=t.weight_decay, fused=True)


variant("default (foreach AdamW)")
variant("fused AdamW", optimizer=fused)
variant("fused AdamW, bf16 logits into cross_entropy", optimizer=fused,
        criterion=lambda logits, y: torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()))
(out / "variants.json").write_text(json.dumps(rows, indent=1) + "\n")

r = type(recipe)()
it = PlainSteps(r, job, 8, dev)
from torch.profiler import ProfilerActivity, profile  # noqa: E402
it.steps = 4
r.loop(it)
it.steps = 3
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    r.loop(it)
(out / "profile.txt").write_text(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30))
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18))
