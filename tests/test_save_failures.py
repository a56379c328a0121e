"""Storage that cannot take a checkpoint (a full disk, a folder that cannot be written): the run
ends with one line naming the fault, the checkpoint already complete and the fix, never a hang;
the same call resumes once the storage is back. A full disk while tokenizing or writing metrics:
an OSError naming the file, one line on the command line. Faults are injected into the save: tests and CI run
as root, where chmod blocks nothing."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests.helpers.runs import quiet_train, tiny_config
from transformer.cli import exit_on_storage_error
from transformer.data.corpus import load_corpus
from transformer.data.tokenizer import ByteTokenizer
from transformer.run import checkpoint
from transformer.run.checkpoint import CheckpointError, latest_step
from transformer.run.metrics import MetricWriter
from transformer.run.workdir import check_workdir

DISK_FULL = ("RESOURCE_EXHAUSTED: Error writing \"opt_state.0.mu/0\" in OCDBT database at local file \"/x/4.orbax-"
             "checkpoint-tmp/state\": Failed to write 424389 bytes to file 11: No space left on device "
             "[os_error_code='28']")


@pytest.mark.slow
@pytest.mark.parametrize("where", ["save", "wait_until_finished"])  # the fault raised by the next save, or at the end
def test_a_failed_save_is_one_line_and_the_run_resumes_once_the_disk_has_room(tmp_path, monkeypatch, where):
    real, real_wait = getattr(ocp.CheckpointManager, where), ocp.CheckpointManager.wait_until_finished

    def full_disk_at_step_4(manager, *args, **kwargs):
        if (args[0] if where == "save" else manager.latest_step()) == 4:
            real_wait(manager)  # orbax waits for the saves in flight before it raises their error
            raise ValueError(DISK_FULL)
        return real(manager, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, where, full_disk_at_step_4)
    with pytest.raises(CheckpointError) as error:
        quiet_train(tiny_config(tmp_path), tmp_path / "run")
    message = str(error.value)
    assert "\n" not in message
    complete = latest_step(tmp_path / "run")  # 2; at the end (wait), step 4's files were on disk before the fault
    assert complete == (2 if where == "save" else 4)
    assert f"(No space left on device); the checkpoint of step {complete} is complete." in message
    assert "Free disk space or make the folder writable, then rerun the same command to resume" in message
    monkeypatch.setattr(ocp.CheckpointManager, where, real)  # room again
    assert quiet_train(tiny_config(tmp_path), tmp_path / "run")["step"] == 6


def test_orbax_thread_tracebacks_are_dropped_once_installed():
    checkpoint.quiet_checkpoint_failures()
    logger = logging.getLogger("absl")
    try:
        raise ValueError(DISK_FULL)
    except ValueError:
        exc_info = sys.exc_info()
    thread = logger.makeRecord("absl", logging.ERROR, "/site-packages/orbax/checkpoint/future.py", 1, "failed",
                               None, exc_info)
    ours = logger.makeRecord("absl", logging.ERROR, "/repo/transformer/x.py", 1, "failed", None, exc_info)
    plain = logger.makeRecord("absl", logging.ERROR, "/site-packages/orbax/checkpoint/future.py", 1, "note",
                              None, None)
    assert not logger.filter(thread)
    assert logger.filter(ours) and logger.filter(plain)


def test_a_checkpoints_folder_that_cannot_be_written_is_refused_before_training(tmp_path, monkeypatch):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)

    def refuse(dir, prefix):
        if dir.endswith("checkpoints"):
            raise PermissionError(13, "Permission denied")
        return str(tmp_path)  # the workdir itself is writable

    monkeypatch.setattr("tempfile.mkdtemp", refuse)
    monkeypatch.setattr("os.rmdir", lambda path: None)
    with pytest.raises(ValueError, match=r"the checkpoints of .* cannot be written \(Permission denied in .*checkpoints\); "
                                         r"make that folder writable"):
        check_workdir(str(tmp_path / "run"))


# --- A full disk elsewhere: the token cache, metrics.jsonl (#31) -----------------------------------

NO_SPACE = OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_while_tokenizing_names_the_cache_and_leaves_no_partial_file(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 50)
    cache = tmp_path / "tokens"

    def full(*args, **kwargs):
        raise NO_SPACE

    monkeypatch.setattr(shutil, "copyfileobj", full)
    with pytest.raises(OSError) as error:
        load_corpus(str(corpus), ByteTokenizer(), cache)
    assert error.value.errno == errno.ENOSPC and error.value.filename.startswith(str(cache / ""))
    assert error.value.filename.endswith(".npy")
    assert not [f for f in os.listdir(cache) if f.endswith((".npy", ".tmp", ".bin"))]  # nothing half-written
    monkeypatch.undo()  # room again
    tokens = load_corpus(str(corpus), ByteTokenizer(), cache)
    assert bytes(np.concatenate([tokens.train, tokens.val]).astype(np.uint8)) == corpus.read_bytes()


def test_a_full_disk_while_writing_metrics_names_the_file(tmp_path):
    writer = MetricWriter(str(tmp_path))

    class FullFile:
        def write(self, text):
            raise NO_SPACE

        def close(self):
            pass

    writer.file = FullFile()
    with pytest.raises(OSError) as error:
        writer.write({"step": 1, "loss": 2.0})
    assert error.value.errno == errno.ENOSPC and error.value.filename == str(tmp_path / "metrics.jsonl")
    writer.close()


def test_a_command_line_ends_a_full_disk_with_one_line_and_raises_any_other_os_error(tmp_path, capsys):
    """`exit_on_storage_error`, which train.py and sweep.py call in `except OSError`."""
    def end_with(error: OSError) -> None:
        try:
            raise error
        except OSError as e:
            exit_on_storage_error(e)

    with pytest.raises(SystemExit) as exit:
        end_with(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "w" / "metrics.jsonl")))
    assert exit.value.code == 1
    assert capsys.readouterr().err == (
        f"error: No space left on device writing {tmp_path / 'w' / 'metrics.jsonl'}: free space on that disk (or give "
        "the run a folder on another one: --workdir, --config.data.cache_dir) and rerun the same command; it resumes "
        "from the last complete checkpoint\n")
    bug = OSError(errno.EBADF, "Bad file descriptor")
    with pytest.raises(OSError) as raised:
        end_with(bug)
    assert raised.value is bug
