"""MetricWriter: every metric row goes to workdir/metrics.jsonl and to TensorBoard (workdir/tb)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping


class MetricWriter:
    """Appends one JSON object per row to metrics.jsonl; scalars also to TensorBoard event files.

    Rows carry their own "step". Disabled writers (hosts other than 0) write nothing.
    """

    def __init__(self, workdir: str, enabled: bool = True):
        self.enabled = enabled
        if not enabled:
            return
        from tensorboardX import SummaryWriter

        self.path = os.path.join(workdir, "metrics.jsonl")
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
            self.tb.close()


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
