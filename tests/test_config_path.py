"""The config's path through a run's set-up, call by call: the files it enters, how often it comes
back to a file it had left, and whether it ever climbs back up the layering (docs/design.md, "The path").

The set-up (`setup.set_up`, as `train.py` calls it through `catalog.train`) runs under a profiler
that follows the config: a call into transformer/ is on the path when one of its arguments is the
config in one of its forms (the ConfigDict or a section of it, the `CheckedConfig`, the
`ModelConfig`, the `Resolved` choice of its 'auto' fields). Each such call moves the config from the
file of the nearest call on the path that is still running (its caller) into the callee's file:

    re-entry   a move into a file the config had entered before and left
    climb      a move into a higher layer than the caller's (model, data < hf, run < training <
               analysis < experiments < the top-level modules): a call back up the layering

Counted on a new run and on a resume (the resume checks read the saved run).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import pytest
from ml_collections import ConfigDict

from configs import tiny
from transformer.experiments.catalog import data_task, eval_metrics
from transformer.model.config import ModelConfig
from transformer.model.execution import Resolved
from transformer.training import setup

PACKAGE = os.path.dirname(os.path.abspath(setup.__file__)).rsplit(os.sep, 1)[0]  # .../transformer
RANK = {"model": 0, "data": 0, "hf": 1, "run": 1, "sampling": 1, "training": 2, "analysis": 3, "experiments": 4}
FORMS = (ConfigDict, setup.CheckedConfig, ModelConfig, Resolved)
MAX_REENTRIES = 20


def layer(file: str) -> int:
    """The layer rank of a file of transformer/ ('run/workdir.py' -> 1); a top-level module ('load.py'): 5."""
    parts = file.split(os.sep)
    return RANK.get(parts[0], 5) if len(parts) > 1 else 5


@dataclass
class Path:
    moves: list[tuple[str, str]]  # (caller's file, callee's file) of each call on the path, in order

    @property
    def files(self) -> set[str]:
        return {f for move in self.moves for f in move}

    @property
    def reentries(self) -> list[str]:
        entered, out = set(), []
        for caller, callee in self.moves:
            if callee != caller and callee in entered:
                out.append(callee)
            entered |= {caller, callee}
        return out

    @property
    def climbs(self) -> list[tuple[str, str]]:
        return [(a, b) for a, b in self.moves if layer(b) > layer(a)]


def follow(fn, *args) -> Path:
    """fn(*args) under a profiler: the moves of the calls into transformer/ that take the config.
    Where our code calls a library (jax.jit, a flax init, eval_shape), the path is lost until that call
    returns: the model's code that jax traces inside it is the compile's, not the set-up's."""
    moves, stack, library = [], [], []  # stack: (frame, file) of the calls on the path still running

    def on_path(frame) -> bool:
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        return any(isinstance(frame.f_locals.get(n), FORMS) for n in names)

    def profile(frame, event, arg):
        file = frame.f_code.co_filename
        if library:  # inside a library call: wait for it to return
            if event == "return" and frame is library[-1]:
                library.pop()
        elif event == "call" and not file.startswith(PACKAGE):
            if frame.f_back is not None and frame.f_back.f_code.co_filename.startswith(PACKAGE):
                library.append(frame)
        elif event == "call" and on_path(frame):
            caller = stack[-1][1] if stack else file
            moves.append((os.path.relpath(caller, PACKAGE), os.path.relpath(file, PACKAGE)))
            stack.append((frame, file))
        elif event == "return" and stack and stack[-1][0] is frame:
            stack.pop()

    sys.setprofile(profile)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return Path(moves)


def test_the_counts_catch_a_path_that_wanders_and_one_that_climbs():
    wanders = Path([("training/setup.py", "model/config.py"), ("training/setup.py", "data/corpus.py"),
                    ("training/setup.py", "model/config.py"), ("data/corpus.py", "data/corpus.py")])
    assert wanders.reentries == ["model/config.py"] and wanders.climbs == []
    climbs = Path([("training/setup.py", "model/config.py"), ("model/config.py", "experiments/catalog.py")])
    assert climbs.climbs == [("model/config.py", "experiments/catalog.py")]
    assert layer("run/workdir.py") == 1 and layer("load.py") == 5


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """{'new': the path of a new run's set-up, 'resume': a resume's (after 2 steps were trained)."""
    from transformer.training.loop import train

    config = tiny.get_config()
    config.data.cache_dir = str(tmp_path_factory.mktemp("tokens"))
    config.train.update(dict(steps=2, eval_every=2, checkpoint_every=2, sample_tokens=0))
    workdir = str(tmp_path_factory.mktemp("run"))
    new = follow(setup.set_up, config, workdir, data_task(config), eval_metrics(config))
    train(setup.set_up(config, workdir, data_task(config), eval_metrics(config)))
    config.train.steps = 4
    resume = follow(setup.set_up, config, workdir, data_task(config), eval_metrics(config))
    return {"new": new, "resume": resume}


@pytest.mark.parametrize("run", ["new", "resume"])
def test_the_config_never_climbs_back_up_and_seldom_comes_back(paths, run):
    path = paths[run]
    assert {"training/setup.py", "model/config.py", "training/optimizer.py"} <= path.files  # it was followed
    assert path.climbs == [], f"calls back up the layering: {path.climbs}"
    assert len(path.reentries) <= MAX_REENTRIES, f"{len(path.reentries)} re-entries: {path.reentries}"
