"""Training and validation batches: windows of a token array, chosen by (seed, step).

The corpus's documents (corpus.py) are tokenized once into a 1-D token array, cached on disk and
memory-mapped (token_stream.py); `batch_at(tokens, seed=, step=, ...)` here is training batch `step`
as a pure function of (seed, step), so a resumed run sees the batches an unbroken run would, and
each host reads only its own rows; `eval_batches` gives fixed validation batches; prefetch.py
computes the next batches in a background thread.

Batches are (inputs, targets), both int32 [B, T], with targets[:, t] == inputs[:, t + 1]: the token
that follows each input position. A target of IGNORED is not graded (the loss leaves it out): the
needle task (experiments/recall/needle.py) grades only the answer of each document.
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
        raise ValueError(
            f"batch_size={batch_size} is not divisible by host_count={host_count}: every host "
            f"needs the same number of rows. Use a batch_size that is a multiple of {host_count}."
        )
    per_host = batch_size // host_count
    return slice(host_index * per_host, (host_index + 1) * per_host)


def _windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Reads tokens[s : s + T + 1] for each start s [B] -> (inputs, targets), int32 [B, T]."""
    rows = np.asarray(tokens[starts[:, None] + np.arange(seq_len + 1)], dtype=np.int32)
    return rows[:, :-1], rows[:, 1:]


def _check_length(tokens: np.ndarray, seq_len: int) -> None:
    if len(tokens) < seq_len + 1:
        raise ValueError(
            f"The token array has {len(tokens)} tokens, fewer than seq_len + 1 = {seq_len + 1} "
            "needed for one (inputs, targets) window. Use a shorter seq_len or more text (for "
            "validation: a larger val_fraction)."
        )


def batch_at(
    tokens: np.ndarray,
    *,
    seed: int,
    step: int,
    batch_size: int,
    seq_len: int,
    host_index: int = 0,
    host_count: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Training batch number `step`: random windows of `tokens` [N], chosen by (seed, step) only.

    The global batch has `batch_size` rows; this host returns its `batch_size // host_count` of them
    and reads only those windows. Returns (inputs, targets), int32 [batch_size // host_count, T].
    """
    _check_length(tokens, seq_len)
    rows = host_rows(batch_size, host_index, host_count)
    rng = np.random.default_rng([seed, step])
    # Every host draws the whole global batch's offsets (cheap), so all agree on who reads what.
    starts = rng.integers(0, len(tokens) - seq_len - 1, size=batch_size, endpoint=True)
    return _windows(tokens, starts[rows], seq_len)


def eval_batches(
    tokens: np.ndarray,
    *,
    num_batches: int,
    batch_size: int,
    seq_len: int,
    host_index: int = 0,
    host_count: int = 1,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Fixed validation batches: `num_batches * batch_size` windows with evenly spaced starts
    from the first to the last possible one, so they cover `tokens` [N] as evenly as possible.

    Returns `num_batches` (inputs, targets) pairs, int32 [batch_size // host_count, T]; host h takes
    its block of rows of each global batch, as in `batch_at`.
    """
    _check_length(tokens, seq_len)
    rows = host_rows(batch_size, host_index, host_count)
    last_start = len(tokens) - seq_len - 1
    starts = np.linspace(0, last_start, num_batches * batch_size).round().astype(np.int64)
    starts = starts.reshape(num_batches, batch_size)
    return [_windows(tokens, batch_starts[rows], seq_len) for batch_starts in starts]


def with_start_token(batch: tuple[np.ndarray, np.ndarray], start_token: int) -> tuple[np.ndarray, np.ndarray]:
    """The same windows begun by a fixed start token (as a BOS token begins a document), or the
    batch unchanged for start_token = -1.

    (inputs [x_0 .. x_{T-1}], targets [y_0 .. y_{T-1}]) -> (inputs [s, x_0 .. x_{T-2}], targets [x_0, y_0 ..
    y_{T-2}]): every row's first token is then the same one (configs/sinks.py tries whether that grows a
    sink). The targets move with their inputs, so a task's ungraded targets (IGNORED) stay ungraded; the
    new first target, x_0, is graded where the row's first target was (text windows: x_0 .. x_{T-1}).
    """
    if start_token == -1:
        return batch
    inputs, targets = batch
    start = np.full((inputs.shape[0], 1), start_token, inputs.dtype)
    first = np.where(targets[:, :1] == IGNORED, IGNORED, inputs[:, :1])
    return np.concatenate([start, inputs[:, :-1]], axis=1), np.concatenate([first, targets[:, :-1]], axis=1)


def text_task(config: Any) -> DataTask:
    """data.task='text': windows of the corpus."""
    return DataTask(batch_at, eval_batches)
