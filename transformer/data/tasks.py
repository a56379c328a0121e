"""A data task: what a training run's batches are. The experiments' table
(transformer/experiments/catalog.py) builds the one `config.data.task` names; the loop knows none.

A task turns a token stream into batches: `batch_at(tokens, seed=, step=, batch_size=, seq_len=,
host_index=, host_count=)` gives training batch `step` and `eval_batches(tokens, num_batches=,
batch_size=, seq_len=, host_index=, host_count=)` the fixed validation batches, both as
(inputs, targets) int32 [B / hosts, T] (see batches.py).

A task says whether it reads text (`DataTask.text`). A text task's batches come from the corpus's
token stream, and the run makes a tokenizer, loads the corpus, reports bits per byte and prints a
text sample. A task with text=False makes its own batches (the tables: float rows [B, T, F + 1] and
targets [B, T]); the run skips all four, and `batch_at` / `eval_batches` get tokens=None.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DataTask:
    """A task's two batch functions (the module docstring gives their arguments)."""

    batch_at: Callable[..., tuple[Any, Any]]
    eval_batches: Callable[..., list[tuple[Any, Any]]]
    text: bool = True  # reads the corpus's token stream; False: no tokenizer, corpus, bits per byte or sample
