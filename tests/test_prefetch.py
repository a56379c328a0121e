"""Tests for transformer/data/prefetch.py: batches computed ahead in a background thread."""

import time

import pytest

from transformer.data.prefetch import Prefetcher


def test_prefetcher_yields_in_order_from_start_step():
    with Prefetcher(lambda step: step * 10, start_step=3, depth=2) as batches:
        assert [next(batches) for _ in range(5)] == [30, 40, 50, 60, 70]
    assert not batches._thread.is_alive()
    assert batches._thread.daemon


def test_prefetcher_propagates_exceptions():
    def fn(step):
        if step == 2:
            raise KeyError("bad step")
        return step

    batches = Prefetcher(fn, start_step=0)
    assert next(batches) == 0 and next(batches) == 1
    with pytest.raises(KeyError, match="bad step"):
        next(batches)
    with pytest.raises(KeyError):  # stays failed
        next(batches)
    batches.close()


def test_prefetcher_closes_while_producer_is_blocked():
    batches = Prefetcher(lambda step: step, start_step=0, depth=1)
    time.sleep(0.05)  # the queue fills and the thread waits for room
    batches.close()
    assert not batches._thread.is_alive()
    with pytest.raises(StopIteration):
        next(batches)
