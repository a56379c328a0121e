"""MetricWriter: every metric row goes to workdir/metrics.jsonl and to TensorBoard (workdir/tb)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from transformer.data.atomic_files import write_atomically


class MetricWriter:
    """Appends one JSON object per row to metrics.jsonl; scalars also to TensorBoard event files.

    Rows carry their own "step". Disabled writers (hosts other than 0) write nothing. A run that
    (re)starts at `start_step` keeps only the rows of steps up to it (none at step 0): the rows a
    killed invocation wrote past its last complete checkpoint are of steps that run again, so the
    file holds each step once, as an unbroken run writes it.
    """

    def __init__(self, workdir: str, enabled: bool = True, start_step: int = 0):
        self.enabled = enabled
        if not enabled:
            return
        from tensorboardX import SummaryWriter

        self.path = os.path.join(workdir, "metrics.jsonl")
        if os.path.exists(self.path):
            kept = [r for r in read_metrics(self.path) if start_step and r["step"] <= start_step]
            write_atomically(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self.file = open(self.path, "a", buffering=1)  # line-buffered: a kill loses no full row
        self.tb = SummaryWriter(os.path.join(workdir, "tb"))

    def write(self, row: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps(dict(row)) + "\n")
        step = int(row["step"])
        for key, value in row.items():
            if key != "step":
                self.tb.add_scalar(key, value, step)

    def close(self) -> None:
        if self.enabled:
            self.file.close()
            try:
                self.tb.close()
            except OSError:  # a full disk: the rows are in metrics.jsonl; the run's own error says why
                pass


def read_metrics(path: str) -> list[dict]:
    """The rows of a metrics.jsonl file (a partial last line from a kill is skipped)."""
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows
