"""Imported once, by the zygote (``liver.agent.zygote``), before it forks any worker: torch and the
worker's modules, the companion's code paths and a training step warmed by rehearsals, and all of it moved out of the
cyclic garbage collector's view, so that no worker's collection walks (and copies) these pages."""

import gc
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from liver.runtime import member  # noqa: E402,F401
from liver.runtime.companion import rehearse  # noqa: E402
from liver.runtime.mock import rehearse_step  # noqa: E402

torch.set_num_threads(1)
rehearse()
rehearse_step()
gc.collect()
gc.freeze()
