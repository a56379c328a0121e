"""One run per workdir (transformer/run/workdir.py): a second run on a workdir in use is
refused before it writes anything, naming the process that holds it; a lock whose process was
killed blocks nothing; a checkpoint written by another run during the set-up is noticed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.helpers.runs import quiet_train, tiny_config
from transformer.run.workdir import check_unchanged
from transformer.run.workdir import LOCK_FILE, WorkdirBusy, WorkdirLock

HOLD = "import sys, time; from transformer.run.workdir import WorkdirLock\n" \
       "with WorkdirLock(sys.argv[1]):\n    print('held', flush=True); time.sleep(120)\n"


@pytest.mark.slow
def test_a_workdir_held_by_another_process_is_refused_until_that_process_dies(tmp_path):
    workdir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(workdir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(WorkdirBusy, match=rf"in use by another run \(process {holder.pid} on .* since "):
            quiet_train(tiny_config(tmp_path, steps=2), workdir)
        assert sorted(os.listdir(workdir)) == [LOCK_FILE]  # nothing of the refused run was written
    finally:
        holder.send_signal(signal.SIGKILL)  # as kill -9: the lock goes with the process, the file stays
        holder.wait()
    assert os.path.exists(workdir / LOCK_FILE)
    assert quiet_train(tiny_config(tmp_path, steps=2), workdir)["step"] == 2


def test_the_lock_excludes_a_second_holder_and_is_released_after_the_block(tmp_path):
    with WorkdirLock(str(tmp_path)):
        with pytest.raises(WorkdirBusy, match=f"process {os.getpid()} on "):
            WorkdirLock(str(tmp_path)).__enter__()
    with WorkdirLock(str(tmp_path)):  # released: taken again
        pass


@pytest.mark.slow
def test_a_finished_run_lets_go_and_a_checkpoint_written_during_the_set_up_is_noticed(tmp_path):
    quiet_train(tiny_config(tmp_path, steps=2), tmp_path / "run")
    with WorkdirLock(str(tmp_path / "run")):  # the finished run let go of it
        pass
    check_unchanged(str(tmp_path / "run"), 2)
    with pytest.raises(WorkdirBusy, match="another run wrote the checkpoint of step 2 .* while this one was setting up"):
        check_unchanged(str(tmp_path / "run"), None)  # this set-up had seen no checkpoint
