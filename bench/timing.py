"""How the benchmarks time things: every figure they print is measured with these functions.

    result, s = timed(fn)                   # one call, its result waited for (jax.block_until_ready)
    s = seconds(fn)                         # the same, the seconds alone
    s = best(fn, repeats, warmup=1)         # the fastest of `repeats` calls, after untimed warm-up calls
    s = alternate(timers, rounds)           # each timer once per round, in turn; each one's fastest
    s = read_seconds(num_bytes, repeats)    # the memory floor: the fastest read of num_bytes

A call ends when its result is ready: JAX dispatches asynchronously, so `timed` blocks on every JAX
array in what `fn` returns (other results, e.g. PyTorch tensors, are ready when returned). The
fastest of several calls is reported, not the mean: on a shared machine the noise only ever adds
time. Compare ratios from one run.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import jax
import numpy as np

Name = TypeVar("Name", bound=Hashable)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(fn's result, the seconds until it was ready)."""
    start = time.perf_counter()
    result = jax.block_until_ready(fn())
    return result, time.perf_counter() - start


def seconds(fn: Callable[[], Any]) -> float:
    """Seconds one call of fn takes, its result waited for."""
    return timed(fn)[1]


def best(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
    """The fastest of `repeats` calls of fn, in seconds, after `warmup` untimed calls (compilation,
    the first touch of memory)."""
    for _ in range(warmup):
        timed(fn)
    return min(seconds(fn) for _ in range(repeats))


def alternate(timers: Mapping[Name, Callable[[], float]], rounds: int,
              after_round: Callable[[dict[Name, list[float]]], None] | None = None) -> dict[Name, float]:
    """Runs every timer (a function returning the seconds it measured) once per round, in turn, and
    returns each one's fastest.

    Interleaved, so that a busy moment of the shared machine hits all the compared sides alike.
    after_round(times so far, by timer) runs after each round: progress lines, a reference sampled
    under the same load.
    """
    times: dict[Name, list[float]] = {name: [] for name in timers}
    for _ in range(rounds):
        for name, timer in timers.items():
            times[name].append(timer())
        if after_round is not None:
            after_round(times)
    return {name: min(t, default=math.inf) for name, t in times.items()}


def read_seconds(num_bytes: int, repeats: int) -> float:
    """The fastest read of num_bytes of float32 from memory, after one read that touches the pages:
    one thread per core sums its share (numpy releases the GIL inside the sum, so the threads read in
    parallel, as XLA's do)."""
    parts = np.array_split(np.ones(num_bytes // 4, np.float32), os.cpu_count() or 1)
    with ThreadPoolExecutor(len(parts)) as pool:
        return best(lambda: list(pool.map(np.sum, parts)), repeats)
