"""One H200: the bench's run() (``liver bench build``'s), with the traceback of a failure; JSON to argv[2]."""
import json
import sys
import traceback

from liver.bench import build

model = sys.argv[1]
if len(sys.argv) > 3 and sys.argv[3] == "off":  # (the first step's work not done ahead: the build as before)
    import liver.engine.native.adapter as A
    A.first_step_ahead = lambda *a, **k: (None, {"ahead": "off"})
sets = ["job.train.micro_batch=1"] + (["job.model.vocab_size=50304"] if model == "1b" else
                                     ["job.model.ffn_size=14336", "job.model.vocab_size=128256"])
try:
    rows = build.run("examples/llama.py:RECIPE", model, ["1,1,8", "2,1,4", "8,1,1"], 3, sets)
    open(sys.argv[2], "w").write(json.dumps(rows, indent=1) + "\n")
    for r in rows:
        print(r["parallel"], {k: round(v, 4) for k, v in r.items() if isinstance(v, float)})
except Exception:
    traceback.print_exc()
