"""Which call of the worker template's preload first leaves a second (CUDA driver) thread: run on
a GPU machine, ``python3 bench/probe/cuda_thread.py``."""
import os
import sys

found = []


def threads():
    return len(os.listdir("/proc/self/task"))


def prof(frame, event, arg):
    if found or event != "return":
        return
    f = frame.f_code.co_filename
    if "/torch/" in f or "/liver/" in f or "examples" in f:
        if threads() > 1:
            stack, fr = [], frame
            while fr is not None and len(stack) < 25:
                stack.append(f"{fr.f_code.co_filename}:{fr.f_lineno} {fr.f_code.co_name}")
                fr = fr.f_back
            found.append(stack)


from liver.runtime.preload import _single_threaded  # noqa: E402

_single_threaded()  # (as the preload does, before torch's import)
import torch  # noqa: E402
print("after import torch", threads())
sys.setprofile(prof)
from liver.runtime.preload import gpu_worker  # noqa: E402
gpu_worker(os.path.abspath("examples/llama.py") + ":RECIPE")
sys.setprofile(None)
print("after preload", threads())
for line in (found[0] if found else ["no second thread"]):
    print(line)
sys.exit(1 if found else 0)
