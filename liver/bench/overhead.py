"""``liver bench overhead``: what LiveR costs a step when nothing happens (the paper's 0.28%).

One recipe, one device, the same job, two ways, interleaved round by round in fresh processes:

- plain: the recipe's own ``loop`` driven by a plain PyTorch iterator (``PlainSteps``): the model
  built on the meta device, materialised on the device, given the first state LiveR gives it (its
  modules' own ``reset_parameters``); ``torch.nn.utils.clip_grad_norm_`` (torch's own, foreach) for the clip;
  the loss read once a step, as a user logs it. No LiveR code runs in the loop.
- liver: ``liver run`` of the same recipe and job on one GPU (one process), no event, no digest, no
  checkpoint: its step records, heartbeats, boundary decision and clip included.

The per-step cost is the time between two steps' ends (everything between them counts), the first
``warmup`` steps of each run left out; the overhead is the ratio of the two medians minus one, with a
bootstrap 95% interval that resamples each side's steps within their rounds.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROUND_KINDS = ("plain", "liver")


class PlainStep:
    """What a recipe's loop body gets, from a plain loop: the model, the optimizer, this step's
    batch, torch's own clip; ``done`` reads the loss (a device wait, as logging it is)."""

    pipelined = False

    def __init__(self, owner: "PlainSteps", inputs, targets) -> None:
        self._owner, self.inputs, self.targets = owner, inputs, targets
        self.job, self.model, self.optimizer, self.mesh = owner.job, owner.model, owner.optimizer, owner.mesh

    def __enter__(self) -> "PlainStep":
        return self

    def __exit__(self, *exc) -> bool:
        return False

    def clip_grad_norm(self, max_norm: float):
        import torch
        return torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm if max_norm > 0 else float("inf"),
                                              foreach=True)

    def schedule_step(self):
        raise RuntimeError("the plain loop runs one device: no pipeline stages")

    def done(self, loss, grad_norm) -> None:
        self._owner.finished(float(loss), float(grad_norm))


class PlainSteps:
    """The iterator a recipe's ``loop`` takes, with nothing of LiveR behind it."""

    def __init__(self, recipe, job, steps: int, device) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        from liver.engine.native.init import initial_values

        self.recipe, self.job, self.steps, self.device = recipe, job, steps, device
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                                    world_size=1)
        self.mesh = init_device_mesh(device.type, (1, 1, 1), mesh_dim_names=("pp", "dp", "tp"))
        with torch.device("meta"):
            model, whole = recipe.model(job), recipe.model(job)
        model = recipe.parallelize(model, self.mesh, job) or model
        model.to_empty(device=device)
        own = dict(model.state_dict(keep_vars=True))
        with torch.no_grad():  # (the values LiveR starts from: liver/engine/native/init.py, on CPU)
            for name, value in initial_values(whole, job.train.seed, None, set(own)):
                own[name].copy_(value)
        recipe.init_buffers(model, job)
        self.model = model
        self.params = sum(p.numel() for p in model.parameters())
        self.optimizer = recipe.optimizer(model, job)
        self.scheduler = recipe.scheduler(self.optimizer, job)
        self.ends: list[float] = []
        self.losses: list[float] = []

    def finished(self, loss: float, norm: float) -> None:
        if self.scheduler is not None:
            self.scheduler.step()
        self.losses.append(loss)
        self.ends.append(time.time())

    def __iter__(self):
        job = self.job
        for k in range(self.steps):
            x, y = self.recipe.batch(job, 0, 1, k * job.train.global_batch)
            yield PlainStep(self, x.to(self.device).contiguous(), y.to(self.device).contiguous())


def plain_main(argv: list[str]) -> int:
    """``python -m liver.bench.overhead --plain ENGINE JOB_JSON STEPS OUT``: one plain run."""
    import torch

    from liver.config.fields import from_dict, with_model
    from liver.engine.interface import load_adapter
    from liver.topology import JobConfig

    engine, job_json, steps, out = argv
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    adapter = load_adapter(engine)  # (absolute: the job's own path)
    recipe = adapter.recipe
    job = with_model(from_dict(JobConfig, json.loads(Path(job_json).read_text()), "job"), adapter.model_config)
    it = PlainSteps(recipe, job, int(steps), device)
    recipe.loop(it)
    mem = torch.cuda.max_memory_reserved(device) / 2**30 if device.type == "cuda" else None
    Path(out).write_text(json.dumps({"ends": it.ends, "losses": it.losses, "params": it.params,
                                     "memory_gib": mem}) + "\n")
    return 0


def _intervals(ends: list[float], warmup: int) -> list[float]:
    return [b - a for a, b in zip(ends[warmup:], ends[warmup + 1:])]


def ratio_ci95(liver: list[list[float]], plain: list[list[float]], draws: int = 2000) -> list[float]:
    """Bootstrap: each side's steps resampled within each of its rounds; the median ratio - 1."""
    rng = random.Random(0)
    out = []
    for _ in range(draws):
        a = [x for r in liver for x in rng.choices(r, k=len(r))]
        b = [x for r in plain for x in rng.choices(r, k=len(r))]
        out.append(statistics.median(a) / statistics.median(b) - 1)
    out.sort()
    return [out[int(0.025 * draws)], out[int(0.975 * draws) - 1]]


def run(engine: str, model: str, sets: list[str], steps: int, rounds: int, warmup: int, out: Path) -> dict[str, Any]:
    import torch

    from liver.config.jobfile import build, override
    from liver.engine.flops import mfu, peak_flops
    from liver.engine.interface import load_adapter
    from liver.topology import ParallelConfig

    if rounds < 1 or steps < warmup + 3:
        raise ValueError(f"--rounds={rounds}, --steps={steps}: allowed rounds >= 1, steps >= warmup ({warmup}) + 3")
    cfg = build({"preset": model, "engine": engine}, *[override(t) for t in sets])
    load_adapter(cfg.engine).layout(cfg.job, ParallelConfig())  # (a bad recipe or shape: refused now)
    gpu = torch.cuda.is_available()
    out.mkdir(parents=True, exist_ok=True)
    job_json = out / "job.json"
    job_json.write_text(json.dumps(cfg.job.to_dict()) + "\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result: dict[str, Any] = {"engine": engine, "model": model, "sets": sets, "steps": steps, "rounds": rounds,
                              "warmup": warmup, "torch": torch.__version__,
                              "device": torch.cuda.get_device_name(0) if gpu else "cpu", "runs": []}
    per: dict[str, list[list[float]]] = {k: [] for k in ROUND_KINDS}
    for r in range(rounds):
        for kind in (ROUND_KINDS if r % 2 == 0 else ROUND_KINDS[::-1]):
            t0 = time.time()
            if kind == "plain":
                res = out / f"plain-{r}.json"
                cmd = [sys.executable, "-m", "liver.bench.overhead", "--plain", cfg.engine, str(job_json), str(steps),
                       str(res)]
            else:
                run_dir = out / f"liver-{r}"
                empty = out / "no-events.txt"
                empty.write_text("# no events\n")
                cmd = [sys.executable, "-m", "liver.cli", "run", "--model", model, "--set", f"engine={cfg.engine}",
                       *[x for t in sets for x in ("--set", t)], "--events", str(empty), "--steps", str(steps),
                       "--gpus", "1", "--parallel", "1,1,1", "--ckpt-every", "0", "--end-after-events", "-1",
                       "--run-dir", str(run_dir), "--backend", "nccl" if gpu else "gloo"]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            (out / f"{kind}-{r}.log").write_text(p.stdout + p.stderr)
            if p.returncode != 0:
                raise RuntimeError(f"{kind} round {r} failed (rc {p.returncode}); log in {out}/{kind}-{r}.log:\n"
                                   f"{(p.stdout + p.stderr)[-2000:]}")
            if kind == "plain":
                data = json.loads(res.read_text())
                ends, losses, mem, params = data["ends"], data["losses"], data["memory_gib"], data["params"]
            else:
                recs = [json.loads(x) for x in (run_dir / "steps.jsonl").read_text().splitlines() if x.strip()]
                ends, losses = [x["time"] for x in recs], [x["loss"] for x in recs]
                mem, params = recs[-1].get("memory_gib"), None
            iv = _intervals(ends, warmup)
            per[kind].append(iv)
            result["runs"].append({"kind": kind, "round": r, "wall_s": time.time() - t0, "median_step_s":
                                   statistics.median(iv), "steps_timed": len(iv), "memory_gib": mem,
                                   "first_losses": losses[:3], "last_loss": losses[-1],
                                   **({"params": params} if params else {})})
            (out / "overhead.json").write_text(json.dumps(result, indent=1) + "\n")
    med = {k: statistics.median([x for r in v for x in r]) for k, v in per.items()}
    result["median_step_s"] = med
    result["overhead"] = med["liver"] / med["plain"] - 1
    result["overhead_ci95"] = ratio_ci95(per["liver"], per["plain"])
    facts = cfg.adapter.facts(cfg.job)
    tokens = cfg.job.train.global_batch * facts.seq_len
    dev = torch.device("cuda", 0) if gpu else torch.device("cpu")
    result["mfu"] = {k: mfu(facts.flops_per_token, tokens / v, peak_flops(dev, cfg.job.compute_dtype), 1)
                     for k, v in med.items()}
    result["compute_dtype"] = cfg.job.compute_dtype
    result["tokens_per_step"] = tokens
    (out / "overhead.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--plain":
        sys.exit(plain_main(sys.argv[2:]))
    sys.exit(2)
