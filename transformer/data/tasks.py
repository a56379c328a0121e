"""A data task: a run's two batch functions, with the arguments and (inputs, targets) [B / hosts, T] of
batches.py's; experiments/catalog.py builds the one `config.data.task` names. A task with text=False
makes its own batches from tokens=None: the run makes no tokenizer, corpus, bits per byte or sample.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DataTask:
    batch_at: Callable[..., tuple[Any, Any]]
    eval_batches: Callable[..., list[tuple[Any, Any]]]
    text: bool = True  # reads the corpus's token stream; False: no tokenizer, corpus, bits per byte or sample
