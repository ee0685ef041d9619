"""Each optimizer form's shard-invariance on this machine's devices, fp32 and bf16 state (JSON)."""
import json
import sys

import torch

from liver.engine.shard_invariance import ADAMW_FORMS, invariant

FORMS = dict(ADAMW_FORMS)
FORMS.update({"sgd-momentum": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, weight_decay=0.1),
              "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2),
              "adafactor": lambda p: torch.optim.Adafactor(p, lr=1e-2)})
CASES = [((1031, 67), (1, 300, 301, 777)), ((64, 33), (5, 40)), ((4096, 2048), (1, 1365, 2730))]
out = {"torch": torch.__version__}
for dev in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
    for dtype in (torch.float32, torch.bfloat16):
        for name, make in FORMS.items():
            got = []
            for shape, cuts in CASES:
                try:
                    got.append(invariant(make, shape, cuts, dev, dtype))
                except (RuntimeError, ValueError) as e:
                    got.append("not run: " + str(e).splitlines()[0][:100])
            out[f"{dev} {str(dtype)[6:]} {name}"] = got
json.dump(out, sys.stdout, indent=1)
