"""One run per workdir: an advisory lock on `workdir/.lock`, held while a run writes there.

A second, independent train.py (or sweep) on the same workdir is refused with a line saying which
process holds it; the processes of one multi-host run share the workdir, and only the first host
takes the lock. The lock is the operating system's (fcntl.flock), so it goes with the process that
held it: a run killed with kill -9 leaves a `.lock` file behind but no lock, and the same command
resumes. (flock is local to a machine: on a network file system shared by several machines it may
not exclude a process on another one.)
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time


class WorkdirBusy(ValueError):
    """Another process holds the workdir's lock."""


LOCK_FILE = ".lock"


class WorkdirLock:
    """`with WorkdirLock(workdir):` holds the workdir's lock (creating the folder), or raises
    WorkdirBusy naming the holder. Released when the block ends or the process dies."""

    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, LOCK_FILE)
        self.fd: int | None = None

    def __enter__(self) -> WorkdirLock:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise WorkdirBusy(
                f"{os.path.dirname(self.path)} is in use by another run ({holder}); wait for it to end, "
                "or give this run another --workdir") from None
        os.ftruncate(fd, 0)  # the holder's record, for the message a second process prints
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
        self.fd = fd
        return self

    def __exit__(self, *exc_info) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def _read_holder(fd: int) -> str:
    """'process 123 on host h since 2026-12-02 15:00:00', from the holder's record."""
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"process {record['pid']} on {record['host']} since {record['since']}"
    except (ValueError, KeyError, OSError):
        return "a process that has not written its record yet"
