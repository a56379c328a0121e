"""Training and validation batches: windows of a token array [N], chosen by (seed, step).

A pure function of (seed, step), so a resumed run sees the batches an unbroken run would. Batches are
(inputs, targets) int32 [B, T], targets[:, t] == inputs[:, t + 1]; a target of IGNORED is not graded.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from transformer.data.tasks import DataTask

IGNORED = -1  # a target the loss leaves out


def host_rows(batch_size: int, host_index: int, host_count: int) -> slice:
    """This host's rows of the global batch: host h of n takes the h-th of n equal blocks."""
    if host_count < 1 or not 0 <= host_index < host_count:
        raise ValueError(f"host_index={host_index} must be in [0, host_count={host_count}).")
    if batch_size % host_count:
        raise ValueError(f"batch_size={batch_size} is not divisible by host_count={host_count}: every host "
                         f"needs the same number of rows. Use a batch_size that is a multiple of {host_count}.")
    per_host = batch_size // host_count
    return slice(host_index * per_host, (host_index + 1) * per_host)


def _windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Reads tokens[s : s + T + 1] for each start s [B] -> (inputs, targets), int32 [B, T]."""
    rows = np.asarray(tokens[starts[:, None] + np.arange(seq_len + 1)], dtype=np.int32)
    return rows[:, :-1], rows[:, 1:]


def _last_start(tokens: np.ndarray, seq_len: int) -> int:
    if len(tokens) < seq_len + 1:
        raise ValueError(f"The token array has {len(tokens)} tokens, fewer than seq_len + 1 = {seq_len + 1} "
                         "needed for one (inputs, targets) window. Use a shorter seq_len or more text (for "
                         "validation: a larger val_fraction).")
    return len(tokens) - seq_len - 1


def batch_at(tokens: np.ndarray, *, seed: int, step: int, batch_size: int, seq_len: int, host_index: int = 0,
             host_count: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Training batch `step` of random windows of `tokens` [N]: this host's rows [batch_size // hosts, T]."""
    last_start, rows = _last_start(tokens, seq_len), host_rows(batch_size, host_index, host_count)
    # Every host draws the whole global batch's offsets (cheap), so all agree on who reads what.
    starts = np.random.default_rng([seed, step]).integers(0, last_start, size=batch_size, endpoint=True)
    return _windows(tokens, starts[rows], seq_len)


def eval_batches(tokens: np.ndarray, *, num_batches: int, batch_size: int, seq_len: int, host_index: int = 0,
                 host_count: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """`num_batches` fixed validation batches of evenly spaced windows; this host's rows of each."""
    last_start, rows = _last_start(tokens, seq_len), host_rows(batch_size, host_index, host_count)
    starts = np.linspace(0, last_start, num_batches * batch_size).round().astype(np.int64)
    return [_windows(tokens, batch_starts[rows], seq_len) for batch_starts in starts.reshape(num_batches, -1)]


def with_start_token(batch: tuple[np.ndarray, np.ndarray], start_token: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs [x_0 .. x_{T-1}], targets [y_0 ..]) -> (inputs [s, x_0 .. x_{T-2}], targets [x_0, y_0 .. y_{T-2}]):
    windows begun by a fixed token as a BOS token begins a document (a sink?); unchanged for -1."""
    if start_token == -1:
        return batch
    inputs, targets = batch
    start = np.full((inputs.shape[0], 1), start_token, inputs.dtype)
    first = np.where(targets[:, :1] == IGNORED, IGNORED, inputs[:, :1])
    return np.concatenate([start, inputs[:, :-1]], axis=1), np.concatenate([first, targets[:, :-1]], axis=1)


def text_task(config: Any) -> DataTask:
    return DataTask(batch_at, eval_batches)
