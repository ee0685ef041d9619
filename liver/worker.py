"""Entry point of a worker process started by the launcher: ``python -m liver.worker SPEC.json``.

The spec names the function's keyword arguments; the result is written beside it as JSON.
The import time is recorded so that a restart's process-start cost is measured, not assumed.
"""

import time

STARTED = time.time()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from liver.engine.segment import run_segment  # noqa: E402

IMPORTED = time.time()


def main() -> None:
    spec_path = sys.argv[1]
    with open(spec_path) as f:
        spec = json.load(f)
    if spec.get("backend", "gloo") == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", spec["rank"])))
        torch.cuda.init()
    else:
        torch.set_num_threads(1)
    ready = time.time()
    out = run_segment(**spec)
    out.pop("full_state", None)
    out["wall"].update(process_start=STARTED, imported=IMPORTED, device_ready=ready)
    with open(spec_path.replace(".json", ".out.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
