"""One finished training run, trained once per pytest worker and copied into each test that needs
one to resume, extend, damage or refuse: the copy is the test's own, the training is paid once.

    def test_something(finished_run):  # finished_run: tmp_path / "w", a copy of the shared run
        out = run(finished_run, "--config.train.steps=6")

The run is configs/tiny.py trained for FINISHED_STEPS steps in this process (evaluated and saved
every 2 steps, no sample), as train.py trains it: the same loop, the same files. Its token cache
lies beside it; a test that resumes through tests/helpers/cli.run uses its own (beside the copy).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers.runs import quiet_train, tiny_config

FINISHED_STEPS = 4


@pytest.fixture(scope="session")
def shared_finished_run(tmp_path_factory) -> Path:
    """The trained run itself (read-only by convention: tests use `finished_run`, a copy)."""
    folder = tmp_path_factory.mktemp("shared_finished_run")
    quiet_train(tiny_config(folder, steps=FINISHED_STEPS, every=2), folder / "run")
    return folder / "run"


@pytest.fixture
def finished_run(shared_finished_run: Path, tmp_path: Path) -> Path:
    """A copy of the shared run at tmp_path / "w": checkpoints at steps 2 and 4, metrics, config, tokenizer."""
    return Path(shutil.copytree(shared_finished_run, tmp_path / "w"))
