"""Data tasks: what a training run's batches are, by name (`config.data.task`).

A task turns a token stream into batches: `batch_at(tokens, seed=, step=, batch_size=, seq_len=,
host_index=, host_count=)` gives training batch `step` and `eval_batches(tokens, num_batches=,
batch_size=, seq_len=, host_index=, host_count=)` the fixed validation batches, both as
(inputs, targets) int32 [B / hosts, T] (see batches.py). The module that defines a task registers
it here; the training loop looks it up by name and knows no task:

    register_task("text", build)     # batches.py: windows of the corpus
    register_task("needle", build)   # needle.py: needle-in-a-document questions
    register_task("tables", build)   # tables.py: synthetic classification tables (text=False)

`build(config)` gets the run's whole config (a ConfigDict), checks what the task needs of it and
returns the task's DataTask. A new task is a module that calls register_task when imported
(`transformer.data` imports the three above).

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


_TASKS: dict[str, Callable[[Any], DataTask]] = {}


def register_task(name: str, build: Callable[[Any], DataTask]) -> None:
    """Makes `data.task=name` build its batches with `build(config)`."""
    if name in _TASKS and _TASKS[name] is not build:
        raise ValueError(f"a data task named {name!r} is already registered; choose another name")
    _TASKS[name] = build


def task_names() -> list[str]:
    return sorted(_TASKS)


def data_task(config: Any) -> DataTask:
    """The DataTask of `config.data.task`, checked against the config."""
    name = config.data.task
    if name not in _TASKS:
        raise ValueError(f"data.task={name!r} is not known; use one of {', '.join(map(repr, task_names()))} "
                         "(a new task registers itself with transformer.data.tasks.register_task)")
    return _TASKS[name](config)
