"""The suite's one rule about cost: a test that starts a subprocess or runs the training loop is
marked `slow` (so `make test` leaves it to `make test-all`) or is one of the end-to-end tests that
tests/end_to_end.py keeps in the default set.

Both are watched while a test is set up and while it runs: `subprocess.Popen` (train.py,
sample.py, notebook kernels, the browser) and the loop's `train_steps` (loop.train, quiet_train).
A fixture seen doing either is remembered, so a later test that reuses its cached value is held to
the rule too.

Compiled programs are kept between runs in a persistent JAX compilation cache (.jax_cache/, or
$JAX_COMPILATION_CACHE_DIR), for this process and the train.py / sample.py processes it starts: a
second `make test` skips most of XLA's compiling (docs/performance.md: "The test suite"), and
within one run the command-line tests share the programs of configs/tiny.py. Entries are written under
JAX's file lock (it takes one when the cache has a size limit), so the two pytest workers and their
subprocesses never read a half-written entry. Only programs that took at least MIN_COMPILE_SECONDS to
compile are kept: with a size limit JAX reads every entry's size and time stamp under that lock at
each write, so thousands of tiny entries (one per eagerly run op) made each write slower than most
compiles, and the two workers waited on each other; a cache grown past MAX_ENTRIES over many runs is
emptied at the start of a run for the same reason.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIN_COMPILE_SECONDS = 0.5  # configs/tiny.py's init and train step take longer: the command-line tests share them
MAX_ENTRIES = 2000
CACHE = {"JAX_COMPILATION_CACHE_DIR": os.path.join(ROOT, ".jax_cache"),
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": str(MIN_COMPILE_SECONDS),
         "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0", "JAX_COMPILATION_CACHE_MAX_SIZE": str(4 << 30)}
for name, value in CACHE.items():  # before JAX is imported here, and inherited by the subprocesses
    os.environ.setdefault(name, value)
if "PYTEST_XDIST_WORKER" not in os.environ:  # once per run, before the workers start
    if len(glob.glob(os.path.join(os.environ["JAX_COMPILATION_CACHE_DIR"], "*-cache"))) > MAX_ENTRIES:
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)

import jax  # noqa: E402
import pytest  # noqa: E402

for name in CACHE:  # in case a plugin imported JAX before this file
    jax.config.update(name.lower(), type(getattr(jax.config, name.lower()))(os.environ[name]))

from tests.end_to_end import KEPT  # noqa: E402
from tests.helpers import shared_runs  # noqa: E402
from transformer.training import loop  # noqa: E402

# Fixtures every test file may use: one finished run, trained once per worker and copied per test.
shared_finished_run, finished_run = shared_runs.shared_finished_run, shared_runs.finished_run

_COSTLY_FIXTURES: dict[str, str] = {}  # fixture name -> what it was seen doing
_SEEN = pytest.StashKey[list]()  # what a test's set-up was seen doing


def cheap(args) -> bool:
    """git, and make's dry runs (`make -n`): they load no JAX and take milliseconds."""
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    program = os.path.basename(os.fsdecode(argv[0])) if argv else ""
    return program == "git" or (program == "make" and "-n" in argv[1:])


@contextlib.contextmanager
def watching_cost(seen: list[str]):
    """Appends to `seen` what the code inside starts: 'a subprocess' or 'the training loop'."""
    execute_child, train_steps = subprocess.Popen._execute_child, loop.train_steps

    def spawn(self, args, *rest, **kwargs):
        if not cheap(args):
            seen.append("a subprocess")
        return execute_child(self, args, *rest, **kwargs)

    def steps(*args, **kwargs):
        seen.append("the training loop")
        return train_steps(*args, **kwargs)

    subprocess.Popen._execute_child, loop.train_steps = spawn, steps
    try:
        yield seen
    finally:
        subprocess.Popen._execute_child, loop.train_steps = execute_child, train_steps


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    with watching_cost([]) as seen:
        result = yield
    if seen:
        _COSTLY_FIXTURES[fixturedef.argname] = seen[0]
    return result


# The files that take longest in `make test` or `make test-all` (docs/performance.md: "The test
# suite"), run first: `--dist loadfile` hands files to the two workers in collection order, so
# the long ones started last would leave one worker idle at the end.
LONGEST_FIRST = ("test_train_cli.py", "test_sharding.py", "test_notebooks.py", "test_train_inputs.py",
                 "test_sinks.py", "test_sweep.py", "test_model.py", "test_checkpoint.py", "test_sampling.py",
                 "test_ops.py", "test_explore.py", "test_optim.py", "test_hf.py", "test_recipe.py",
                 "test_attention_impl.py", "test_training.py", "test_kill_in_save.py", "test_backend.py")


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects anything
def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's order is kept
    kept_but_slow = [item.nodeid for item in items if item.nodeid in KEPT and item.get_closest_marker("slow")]
    if kept_but_slow:
        raise pytest.UsageError(f"{kept_but_slow[0]} is kept in the default set by tests/end_to_end.py but is marked "
                                "slow, so `make test` would leave it out: remove its slow mark, or its entry there")


def _exempt(item) -> bool:
    return item.get_closest_marker("slow") is not None or item.nodeid in KEPT


def _check_cost(item, seen: list[str]) -> None:
    costly = [f"it starts {what}" for what in dict.fromkeys(seen)]
    costly += [f"its fixture '{name}' starts {what}" for name, what in _COSTLY_FIXTURES.items()
               if name in item.fixturenames]
    if costly and not _exempt(item):
        pytest.fail(f"{item.nodeid}: {costly[0]}, but it is not marked slow: mark it @pytest.mark.slow, or "
                    "list it in tests/end_to_end.py as an end-to-end test the default set keeps", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with watching_cost([]) as seen:
        result = yield
    item.stash[_SEEN] = seen
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with watching_cost(list(item.stash.get(_SEEN, []))) as seen:
        result = yield
    _check_cost(item, seen)
    return result

