#!/bin/bash
# One H200, the GPU image (torch 2.11): the model's facts (issue 30, item 5) on a GPU.
# 1) the example at the 1b preset, bf16, one GPU through `liver run`: the step line's MFU now comes from
#    the adapter's facts (ModelFacts.flops_per_token); facts.json recomputes it from the report's tokens/s.
# 2) a recipe of its own model configuration (tests/recipes/own_config.py: depth, width, context, vocab)
#    at a GPU-sized shape, fp32, one GPU: filled from [job.model] through --set, its MFU from its own facts.
# 3) the layering, controller, configuration and MFU tests and the own-configuration test on torch 2.11.
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
: > /tmp/none.events
python3 -m liver.cli run --config configs/llama-native.toml --set preset=1b --backend nccl --gpus 1 --slots 1 \
  --set parallel=1,1,1 --set job.compute_dtype=bfloat16 --set job.model.num_layers=16 --set job.model.hidden_size=2048 \
  --set job.model.num_heads=16 --set job.model.ffn_size=5632 --set job.model.vocab_size=32000 --set job.model.seq_len=2048 \
  --events /tmp/none.events --steps 30 --end-after-events -1 --ckpt-every 0 --digest switch --set timeline=false \
  --run-dir /tmp/r1 > $OUT/run-example-1b.log 2>&1
cp /tmp/r1/report.json $OUT/report-example-1b.json
python3 -m liver.cli run --set engine=tests/recipes/own_config.py:RECIPE --backend nccl --gpus 1 --slots 1 \
  --set parallel=1,1,1 --set job.model.depth=8 --set job.model.width=2048 --set job.model.context=1024 \
  --set job.model.vocab=32000 --events /tmp/none.events --steps 30 --end-after-events -1 --ckpt-every 0 \
  --set timeline=false --run-dir /tmp/r2 > $OUT/run-own-config.log 2>&1
cp /tmp/r2/report.json $OUT/report-own-config.json
python3 - > $OUT/facts.json <<'PY'
import json, statistics, torch
from liver.config import jobfile
from liver.engine.flops import peak_flops
out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
for name in ("example-1b", "own-config"):
    rep = json.load(open(f"/tmp/{'r1' if name == 'example-1b' else 'r2'}/report.json"))
    cfg = jobfile.build(json.load(open(f"/tmp/{'r1' if name == 'example-1b' else 'r2'}/config.json")))
    f = cfg.adapter.facts(cfg.job)
    steps = rep["steps"][5:]
    tps = statistics.median(s["tokens_per_s"] for s in steps)
    out[name] = {"model": type(cfg.job.model).__name__, "facts": {k: getattr(f, k) for k in ("params", "layers", "width", "seq_len", "flops_per_token")},
                 "median_tokens_per_s": tps, "median_mfu_step_line": statistics.median(s["mfu"] for s in steps),
                 "mfu_from_facts": f.flops_per_token * tps / peak_flops(torch.device("cuda", 0), cfg.job.compute_dtype),
                 "model_description": rep.get("model_description"), "compute_dtype": cfg.job.compute_dtype}
print(json.dumps(out, indent=1))
PY
python3 -m pytest -q tests/test_layering.py tests/test_controller.py tests/test_config.py \
  tests/test_engine.py::test_mfu_is_the_models_flops_over_the_peak_of_the_dtype_its_matmuls_run_in \
  "tests/test_native.py::test_a_recipes_own_model_configuration_is_filled_checked_and_priced_through_its_facts" \
  -p no:cacheprovider 2>&1 | tail -3 > $OUT/pytest.log   # (test_policy and test_sim need simpy: the sim extra, not on this image)
git log -1 --format=%H > $OUT/commit.txt
