"""Stopping a run on SIGINT (Ctrl-C) or SIGTERM without losing it: at once during the set-up (nothing
is written yet); during training at the next step, which saves a checkpoint (`stop.requested`)."""

from __future__ import annotations

import os
import signal
import sys


class Interrupted(Exception):
    """SIGINT or SIGTERM stopped the run; the exit code is 128 + the signal's number."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.exit_code = 128 + signum


class StopOnSignal:
    """While active, SIGTERM / SIGINT stop the run; the previous handlers come back afterwards.
    During the set-up (training=False) at once: Interrupted, or with `hard_exit` the process ends,
    leaving no library half-way through a compile. During training: `requested` turns true."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, hard_exit: bool = False, training: bool = False):
        self.hard_exit, self.training = hard_exit, training
        self.signum: int | None = None
        self.previous = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> StopOnSignal:
        for sig in self.SIGNALS:
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.signum = signum
        if self.training:
            return
        message = f"{signal.Signals(signum).name} during set-up: stopped; nothing was written to the workdir"
        if self.hard_exit:
            print(message, file=sys.stderr, flush=True)
            os._exit(128 + signum)
        raise Interrupted(signum, message)

    def __exit__(self, *exc_info) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def stopped_after_saving(self, step: int) -> Interrupted:
        """The error that ends a run stopped by a signal once its checkpoint at `step` is saved."""
        return Interrupted(self.signum, f"{signal.Signals(self.signum).name}: stopped after saving the "
                                        f"checkpoint at step {step}; rerun the same command to resume")
