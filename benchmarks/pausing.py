"""Stopping another process (SIGSTOP) while a measured phase runs, so that timings are not its, and continuing it
(SIGCONT) after, within a budget of seconds: benchmarks/scale.py's --pause-pid."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager


class Pauser:
    """Stops another process while a measured phase runs and continues it after, within a budget of seconds."""

    def __init__(self, pid: int | None, budget_s: float):
        self.pid = pid
        self.left_s = budget_s if pid else 0.0
        self._stopped = False
        self._lock = threading.Lock()

    def resume_on_exit(self) -> None:
        """Continues the process however this one ends short of SIGKILL: normal exit, exception, signal."""
        atexit.register(self.resume)
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(number, self._resume_and_exit)

    @contextmanager
    def phase(self, pause: bool = True):
        """Yields a dict whose "paused_s" says how long the process was stopped during the block (not at all
        unless `pause`)."""
        record = {"paused_s": 0.0, "seconds": 0.0, "load_average_before": os.getloadavg()[0]}
        started = time.monotonic()
        if self.left_s <= 0 or not pause:
            yield record
            record["seconds"] = time.monotonic() - started
            return
        self._signal(signal.SIGSTOP)
        timer = threading.Timer(self.left_s, self.resume)
        timer.start()
        try:
            yield record
        finally:
            timer.cancel()
            self.resume()
            record["seconds"] = time.monotonic() - started
            record["paused_s"] = min(record["seconds"], self.left_s)
            self.left_s -= record["paused_s"]

    def resume(self) -> None:
        with self._lock:
            if self._stopped:
                self._signal(signal.SIGCONT)

    def _signal(self, number: int) -> None:
        try:
            os.kill(self.pid, number)
        except ProcessLookupError:
            self.left_s = 0.0
        self._stopped = number == signal.SIGSTOP

    def _resume_and_exit(self, number, frame) -> None:
        self.resume()
        sys.exit(128 + number)
