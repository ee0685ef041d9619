"""Megatron-Core behind LiveR (issue 31, in steps): a GPT model of Megatron-Core built on a
generation's own groups (``model.py``: no ``initialize_model_parallel``), its configuration as the
job file gives it (``config.py``), and its Resource View read from Megatron's own sharded-state
metadata (``view.py``; the distributed optimizer's flat ranges cut into boxes: ``ranges.py``), and
what its code asks of CUDA answered on a CPU build of torch (``cpu.py``). Not yet: the engine
adapter a job file selects, its optimizer and DDP, live reshapes and Megatron's own restart.
Megatron-Core is an optional dependency (``pip install liver[megatron]``): importing this package
does not import it; ``model.megatron()`` does, or says how to install it."""
