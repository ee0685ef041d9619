"""One H200: where a new engine's first step beyond its second goes, for the example at 1B on rank 0 of
tp1pp1dp8 over a mock world, with the switch's prebuild: the probe in bench/probe/first_step (run here
with this folder's arguments; first_step_gpu.txt came from the same code, then kept in this file)."""
import runpy
import sys
from pathlib import Path

sys.argv = [sys.argv[0], "1b", "1,1,8", "job.model.vocab_size=50304"]
runpy.run_path(str(Path(__file__).resolve().parents[2] / "probe" / "first_step" / "first_step_gpu.py"),
               run_name="__main__")
