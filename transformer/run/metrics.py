"""MetricWriter: every metric row goes to workdir/metrics.jsonl and to TensorBoard (workdir/tb)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping

from transformer.data.atomic_files import write_atomically


class MetricWriter:
    """Appends one JSON object per row (with its "step") to metrics.jsonl, scalars also to TensorBoard
    (disabled on hosts other than 0). A run (re)starting at `start_step` keeps the rows up to it (none
    at 0) and rewrites TensorBoard's from them: a killed run's later steps run again, each logged once."""

    def __init__(self, workdir: str, enabled: bool = True, start_step: int = 0):
        self.enabled = enabled
        if not enabled:
            return
        from tensorboardX import SummaryWriter

        self.path = os.path.join(workdir, "metrics.jsonl")
        kept = []
        if os.path.exists(self.path):
            kept = [r for r in read_metrics(self.path) if start_step and r["step"] <= start_step]
            write_atomically(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self.file = open(self.path, "a", buffering=1)  # line-buffered: a kill loses no full row
        tb_dir = os.path.join(workdir, "tb")
        shutil.rmtree(tb_dir, ignore_errors=True)  # remade from metrics.jsonl, which a kill leaves whole
        self.tb = SummaryWriter(tb_dir)
        for row in kept:
            self._add_scalars(row)

    def write(self, row: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        try:
            self.file.write(json.dumps(dict(row)) + "\n")
        except OSError as e:  # a full disk: name the file (a write's error names none)
            raise OSError(e.errno, e.strerror, self.path) from e
        self._add_scalars(row)

    def _add_scalars(self, row: Mapping[str, float]) -> None:
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
    """The JSON objects with an integer "step" in a metrics.jsonl file (a kill's partial line: skipped)."""
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows.append(row)
    return rows
