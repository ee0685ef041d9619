"""Streaming transfer: executes a plan through a bounded staging budget."""

from liver.transfer.executor import StreamingExecutor, TransferStats

__all__ = ["StreamingExecutor", "TransferStats"]
