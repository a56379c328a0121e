"""Running train.py and sample.py in subprocesses, as a user would, for the CLI tests."""

from __future__ import annotations

import os
import subprocess
import sys

from transformer.run.metrics import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "tiny.py")


def train_cmd(workdir, *overrides, config: str = TINY) -> list[str]:
    """train.py on configs/tiny.py with the token cache beside the workdir."""
    return [sys.executable, os.path.join(ROOT, "train.py"), "--config", config, "--workdir", str(workdir),
            f"--config.data.cache_dir={os.path.join(os.path.dirname(str(workdir)), 'tokens')}", *overrides]


def run(workdir, *overrides, timeout: int = 300, cwd: str = ROOT, env: dict | None = None,
        **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(train_cmd(workdir, *overrides, **kwargs), capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=env)


def sample(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "sample.py"), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300, env=env)


def losses(workdir) -> dict[int, float]:
    """{step: training loss} from workdir/metrics.jsonl."""
    return {r["step"]: r["loss"] for r in read_metrics(os.path.join(workdir, "metrics.jsonl")) if "loss" in r}


def learning_rates(workdir) -> dict[int, float]:
    return {r["step"]: r["learning_rate"] for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))
            if "learning_rate" in r}
