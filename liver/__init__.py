"""LiveR: live reconfiguration of mixed-parallel (TP x PP x DP) LLM training."""

__version__ = "0.1.0"
