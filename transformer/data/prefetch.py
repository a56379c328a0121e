"""Data loading overlapped with training: a background thread computes the next batches.
    with Prefetcher(lambda step: batch_at(tokens, seed=0, step=step, ...), start_step) as batches:
        for inputs, targets in batches:   # batch n + 1 is being read while step n trains
            ...
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Prefetcher(Generic[T]):
    """fn(start_step), fn(start_step + 1), ... computed `depth` ahead by a thread; fn's error raises in next()."""

    def __init__(self, fn: Callable[[int], T], start_step: int, depth: int = 2):
        if depth < 1:
            raise ValueError(f"depth={depth} must be >= 1 (the number of results computed ahead).")
        self._queue: queue.Queue[tuple[T | None, BaseException | None]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, args=(fn, start_step), daemon=True, name="Prefetcher")
        self._thread.start()

    def _work(self, fn: Callable[[int], T], step: int) -> None:
        while not self._stop.is_set():
            try:
                item = (fn(step), None)
            except BaseException as e:  # handed to the consumer, who decides what to do
                item = (None, e)
            while not self._stop.is_set():  # wait for room, but notice close() instead of blocking forever
                with contextlib.suppress(queue.Full):
                    self._queue.put(item, timeout=0.1)
                    break
            if item[1] is not None:
                return
            step += 1

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._error is not None:
            raise self._error
        while not self._stop.is_set():  # wake up now and then, so a close() from another thread ends the wait
            with contextlib.suppress(queue.Empty):
                value, self._error = self._queue.get(timeout=0.1)
                if self._error is not None:
                    raise self._error
                return value
        raise StopIteration

    def close(self) -> None:
        """Stops the background thread; waits for the current fn call to finish (up to 10 s)."""
        self._stop.set()
        with contextlib.suppress(queue.Empty):  # free the queue so a blocked put returns
            while True:
                self._queue.get_nowait()
        self._thread.join(timeout=10.0)

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
