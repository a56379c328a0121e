"""A run's folder: checked before a run writes there (writable; a resume continues the checkpoint's
model, data, tokenizer and corpus), locked while one run writes it, written once the set-up succeeded.
Each check raises ValueError (or CheckpointError) naming the fix."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import tempfile
import time

from ml_collections import ConfigDict

from transformer.data.atomic_files import save_json
from transformer.data.tokenizer import Tokenizer, is_saved, save_tokenizer
from transformer.run.checkpoint import CHECKPOINT_DIR, CheckpointError, check_same_model, latest_step


def check_workdir(workdir: str) -> None:
    """A clear error for a workdir that is empty, a file, or cannot be created or written."""
    if not workdir or not workdir.strip():
        raise ValueError("--workdir is empty; name a folder for the run, e.g. --workdir runs/my_run")
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ValueError(f"--workdir {workdir!r} is a file, not a folder; choose another --workdir")
    existing = os.path.abspath(workdir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"--workdir {workdir!r} cannot be created: {existing} is a file")
    check_writable(existing, f"--workdir {workdir!r} cannot be written", "choose a folder you can write to")
    checkpoints = os.path.join(workdir, "checkpoints")
    if os.path.isdir(checkpoints):  # a resume: its saves go there
        check_writable(checkpoints, f"the checkpoints of {workdir!r} cannot be written",
                       "make that folder writable (chmod u+w), then rerun")


def check_writable(folder: str, what: str, fix: str) -> None:
    """Raises ValueError('<what> (<reason> in <folder>); <fix>') unless a file can be made in `folder`
    (the only sure test of writing)."""
    try:
        os.rmdir(tempfile.mkdtemp(dir=folder, prefix=".write-test-"))
    except OSError as e:
        raise ValueError(f"{what} ({e.strerror} in {folder}); {fix}") from None


# What a resumed run must share with the run that saved the checkpoint, beyond the model.
SAME_DATA = ("tokenizer", "vocab_size", "path")
# A task's fields that checkpoints from before they existed were trained with.
EARLIER_DEFAULTS = {"needle": {"facts": 1, "question": "question", "questions": 1}}


def check_resume(config: ConfigDict, record: dict, saved: dict, workdir: str) -> None:
    """Checks the config (`record`: as the run saves it) against the latest checkpoint's (`saved`,
    with its "step"): another model or data, or fewer train.steps than done, are errors; changed
    execution fields a note."""
    step = saved["step"]
    changed = check_same_model(saved["model"], record["model"], os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR))
    # data.task too: text windows and needle documents are different data on the same corpus
    # (a checkpoint from before the field existed was trained on text).
    saved_data = {**saved_data_fields(saved), "task": saved.get("data", {}).get("task", "text")}
    differ = [f"data.{k}: checkpoint {v!r}, config {config.data[k]!r}"
              for k, v in saved_data.items() if v != config.data[k]]
    task = saved_data["task"]
    if task == config.data.task and task in config.data:  # the task's own fields (the documents, the prior)
        before = {**EARLIER_DEFAULTS.get(task, {}), **saved["data"].get(task, {})}
        differ += [f"data.{task}.{k}: checkpoint {v!r}, config {config.data[task][k]!r}"
                   for k, v in sorted(before.items()) if k in config.data[task] and v != config.data[task][k]]
    if differ:
        raise CheckpointError(f"the checkpoints in {workdir} were trained on other data ({'; '.join(differ)}); "
                              "resume with the same data fields, or start a new --workdir")
    if config.train.steps < step:
        raise ValueError(f"train.steps={config.train.steps} is below the checkpoint's step {step} in {workdir}; "
                         f"set train.steps >= {step}, or start a new --workdir")
    if changed:
        print(f"resuming with other execution settings: {', '.join(changed)}")


def check_tokenizer_left(config: ConfigDict, workdir: str) -> None:
    """Raises if the tokenizer left in `workdir` by a run that saved no checkpoint was made for other
    data than the config's (that run's config.json)."""
    config_json = os.path.join(workdir, "config.json")
    left = {}
    if os.path.isfile(config_json):
        with open(config_json) as f:
            left = saved_data_fields(json.load(f))
    differ = [f"data.{k}: {left.get(k)!r} there, {config.data[k]!r} now" for k in SAME_DATA
              if left.get(k) != config.data[k]]
    if differ:
        raise ValueError(f"{os.path.join(workdir, 'tokenizer')} was made for other data ({'; '.join(differ)}); "
                         "delete that folder (the run saved no checkpoint) or choose another --workdir")


def saved_data_fields(saved: dict) -> dict:
    """The SAME_DATA fields of a saved config, a relative data.path made absolute as `resolve` does."""
    fields = {k: saved.get("data", {}).get(k) for k in SAME_DATA}
    if fields["path"]:
        fields["path"] = os.path.abspath(os.path.expanduser(fields["path"]))
    return fields


CORPUS_RECORD = "corpus.json"  # in the workdir: [[path, SHA-256], ...] of the files the run trains on


def check_corpus_kept(workdir: str, digests: list[list[str]]) -> None:
    """Raises if the corpus files differ from those in the workdir's corpus.json (none: not checked),
    naming what was removed, added or changed."""
    record = os.path.join(workdir, CORPUS_RECORD)
    if not os.path.isfile(record):
        return
    try:
        with open(record, encoding="utf-8") as f:
            before = json.load(f)
        if not all(isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in before):
            raise ValueError("not a list of [path, SHA-256] pairs")
        before = dict(before)
    except (ValueError, TypeError) as e:  # cut short or edited by hand: it is the run's record, not the corpus
        raise CheckpointError(f"{record} is damaged ({e}): if the corpus is the one this run trained on, delete "
                              f"{record} (the run writes it again) and rerun; else use a new --workdir") from None
    now = dict(digests)
    what = ([f"removed {p}" for p in before if p not in now] + [f"added {p}" for p in now if p not in before]
            + [f"changed {p}" for p in now if p in before and now[p] != before[p]])
    if what:
        more = f"; {len(what) - 3} more" if len(what) > 3 else ""
        raise CheckpointError(f"the corpus changed since the checkpoints in {workdir} were written ({'; '.join(what[:3])}"
                              f"{more}): the validation loss would mix two validation sets. Restore the corpus, or "
                              "train on the new one in a new --workdir")


def check_unchanged(workdir: str, step: int | None) -> None:
    """Raises WorkdirBusy if another run wrote a checkpoint since the set-up saw `step` (None: none)."""
    now = latest_step(workdir)
    if now != step:
        raise WorkdirBusy(f"another run wrote the checkpoint of step {now} in {workdir} while this one was "
                          "setting up; rerun the command to resume from it")


def write_run_files(workdir: str, host: int, tokenizer: Tokenizer | None, record: dict, corpus: list) -> None:
    """After a successful set-up: the workdir, its tokenizer, config.json (`record`) and corpus.json,
    written by the first host (the hosts share the workdir)."""
    os.makedirs(workdir, exist_ok=True)
    if host != 0:
        return
    tok_dir = os.path.join(workdir, "tokenizer")
    if tokenizer is not None and not is_saved(tok_dir):  # kept once complete: a resume reads it
        save_tokenizer(tokenizer, tok_dir)
    save_json(os.path.join(workdir, "config.json"), record)
    save_json(os.path.join(workdir, CORPUS_RECORD), corpus)  # what a resume checks the corpus against


class WorkdirBusy(ValueError):
    """Another process holds the workdir's lock."""


LOCK_FILE = ".lock"


class WorkdirLock:
    """`with WorkdirLock(workdir):` holds an fcntl.flock on workdir/.lock (local to a machine), or
    raises WorkdirBusy naming the holder; it goes with the process, so a kill -9 leaves no lock."""

    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, LOCK_FILE)
        self.fd: int | None = None

    def __enter__(self) -> WorkdirLock:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise WorkdirBusy(
                f"{os.path.dirname(self.path)} is in use by another run ({holder}); wait for it to end, "
                "or give this run another --workdir") from None
        os.ftruncate(fd, 0)  # the holder's record, for the message a second process prints
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
        self.fd = fd
        return self

    def __exit__(self, *exc_info) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def _read_holder(fd: int) -> str:
    """'process 123 on host h since 2026-12-02 15:00:00', from the holder's record."""
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"process {record['pid']} on {record['host']} since {record['since']}"
    except (ValueError, KeyError, OSError):
        return "a process that has not written its record yet"
