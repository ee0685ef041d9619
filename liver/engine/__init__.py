"""Training engines: ``interface.py`` is what the runtime needs of one; ``reference/`` is the first
implementation (a Llama-style decoder with Megatron-style TP, 1F1B pipelining and AdamW);
``digest.py`` the layout-independent digest of any engine's state."""
