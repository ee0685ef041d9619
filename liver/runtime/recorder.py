"""A step's records, written off the step's critical path: rank 0's record in the store (what the
controller reads) and in steps.jsonl, and the step line, by a thread of their own, in the order
the steps ended. The training thread only hands them over; the writes (JSON, a store round trip,
a file and the log) cost a step about 2 ms on a GPU (bench/results/gpu-1b-native-overhead).

``drain`` waits until every record handed over is written: before a switch (the next generation's
rank 0 appends to the same file), a stall, a stop, and the process's exit."""

from __future__ import annotations

import queue
import threading
from typing import Callable

from liver.protocol.store import run_store
from liver.world.world import connect_store


class Recorder:
    def __init__(self, store_addr: str) -> None:
        self._addr = store_addr
        self._queue: queue.Queue[Callable] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._store = None
        self._error: BaseException | None = None

    def put(self, write: Callable) -> None:
        """``write(store)`` on the recorder's thread (its own connection to the job's store); a
        write that failed fails the step after it, here, as it would have failed in line."""
        if self._error is not None:
            raise RuntimeError(f"a step record could not be written: {self._error!r}") from self._error
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="liver-recorder", daemon=True)
            self._thread.start()
        self._queue.put(write)

    def drain(self) -> None:
        if self._thread is not None:
            self._queue.join()

    def _run(self) -> None:
        while True:
            write = self._queue.get()
            try:
                if self._store is None:
                    self._store = run_store(connect_store(self._addr))
                write(self._store)
            except Exception as e:
                self._error = e
            finally:
                self._queue.task_done()
