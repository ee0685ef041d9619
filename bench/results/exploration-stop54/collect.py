"""Collects the runs of stop 54's exploration (their report.json, made by the commands in COMMAND)
into facts.json: each run's events and, per step, its loss, gradient norm and standing checkpoint.
    python bench/results/exploration-stop54/collect.py /tmp/ex > bench/results/exploration-stop54/facts.json"""
import json
import sys
from pathlib import Path

RUNS = {  # run directory under the exploration's root -> (the code it ran, what it shows)
    "r6": ("7b077fc", "bug 1 before: 1,2,1 native, reshape at step 14, checkpoint every 5: never switched, checkpoint_step stuck at 10"),
    "r9": ("6fdc1ba", "bug 1 after: the same run switches at step 17 and checkpoints go on"),
    "s-f-212": ("b9ce725", "bug 2 before: 2,1,2 fp32, step 2's norm 1.783"),
    "s-f-122": ("b9ce725", "bug 2 before: 1,2,2 fp32, step 2's norm 1.914 (the right one)"),
    "s-b-122": ("b9ce725", "bug 3 before: 1,2,2 bf16, every loss NaN"),
    "s-b-222": ("b9ce725", "bug 3 before: 2,2,2 bf16, every loss NaN"),
    "f-212": ("f7d31d9 (norm fix in the working tree)", "bug 2 after: 2,1,2 fp32 norms 2.149679 / 1.913973 / 1.567778"),
    "h-bfloat16": ("f7d31d9", "bug 3 after: 1,2,2 bf16"),
    "h-float32": ("f7d31d9", "1,2,2 fp32 after both fixes"),
    "hh": ("f7d31d9", "1,1,2 bf16: the reference for bug 3's losses"),
    "k-bfloat16": ("f7d31d9", "2,2,2 bf16 on 8 processes after the fixes"),
    "t1": ("b9ce725", "bug 4 after: the p3 trace on the native job file, compress 3000"),
    "ck2": ("649063b plus a temporary injection (COMMAND)", "a checkpoint write failing on one rank alone: the reshape switches ~300 s later"),
    "pc1": ("f7d31d9", "native bf16 with --precopy, three reshapes, live"),
    "pc3": ("f7d31d9", "the same changes through restart-forked at pc1's cuts: losses equal to pc1's"),
    "kill1": ("f7d31d9", "kill -9 of proc 2 in native bf16 1,2,2: recovered on tp1pp1dp3"),
    "m1": ("f7d31d9", "Megatron 1,2,1 -> 2,1,1 -> 1,3,1 -> 1,1,3 -> 1,2,1, checkpoint every step"),
    "mb1": ("f7d31d9", "Megatron bf16 1,2,2 -> 2,2,1 -> 1,1,2 with a deadline"),
    "env1": ("f7d31d9", "RANK/WORLD_SIZE/MASTER_*/SLURM_* and TORCH_DISTRIBUTED_DEBUG=DETAIL set"),
    "fc1": ("f7d31d9", "--from-checkpoint of r9's 1,2,1 fp32 checkpoints onto 2,1,2 bf16"),
    "nn1": ("f7d31d9", "--nodes 2: scale-out to 2,1,2, scale-in with a deadline to 1,2,1"),
    "dg1": ("f7d31d9", "native bf16 1,2,2 -> 2,1,2 live, a digest after every step"),
    "dg3": ("f7d31d9", "the same change through restart-forked at dg1's cut: every step's loss and digest equal"),
    "u-111": ("f7d31d9", "hidden 48, one process"),
    "u-213": ("f7d31d9", "hidden 48 over 2,1,3 (uneven FSDP2 with TP)"),
    "u-132": ("f7d31d9", "hidden 48 over 1,3,2"),
}


def main(root: Path) -> dict:
    out = {}
    for name, (code, shows) in RUNS.items():
        f = root / name / "report.json"
        if not f.exists():
            continue
        r = json.loads(f.read_text())
        out[name] = {
            "code": code, "shows": shows, "wall_s": r.get("wall_s"),
            "events": [{k: e.get(k) for k in ("event", "old", "new", "outcome", "status", "last_old_step",
                                              "downtime_s", "prepare_s", "digest_before", "digest_after",
                                              "deadline_met", "restored_step")} for e in r["events"]],
            "steps": [[s["step"], s["generation"], s["parallel"], s["loss"], s["grad_norm"], s["checkpoint_step"],
                       s["checkpoint_failures"], s["digest"]] for i, s in enumerate(r["steps"])
                      if len(r["steps"]) <= 500 or i < 30 or i >= len(r["steps"]) - 30 or i % 500 == 0],
            "steps_columns": ["step", "generation", "parallel", "loss", "grad_norm", "checkpoint_step",
                              "checkpoint_failures", "digest"],
        }
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1])), indent=0))
