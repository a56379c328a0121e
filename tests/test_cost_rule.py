"""tests/conftest.py's rule, checked on a scratch test file run by pytest in this process: a test
that starts a subprocess or runs the training loop, itself or through a fixture, fails unless it is
marked slow or kept in tests/end_to_end.py; other tests are left alone."""

from __future__ import annotations

import os

import pytest

from tests.end_to_end import KEPT

pytest_plugins = ["pytester"]

SCRATCH = '''
import contextlib, subprocess, pytest
from transformer.training import loop

@pytest.fixture(scope="module")
def spawned():
    subprocess.run(["true"], check=True)

def test_spawns():
    subprocess.run(["true"], check=True)

def test_runs_git_and_a_dry_make():
    subprocess.run(["git", "--version"], check=True, capture_output=True)
    subprocess.run(["make", "-n", "-f", "/dev/null", "x"], capture_output=True)

@pytest.mark.slow
def test_spawns_marked():
    subprocess.run(["true"], check=True)

def test_trains():
    with contextlib.suppress(TypeError):  # the watched name, as loop.train_and_report calls it
        loop.train_steps()

def test_uses_a_spawning_fixture_first(spawned):
    pass

def test_uses_the_cached_fixture_later(spawned):
    pass

def test_pure():
    assert 1 + 1 == 2
'''


@pytest.mark.slow  # the scratch tests start subprocesses (`true`), watched by this run's rule too
def test_unmarked_costly_tests_fail_and_the_rest_pass(pytester):
    pytester.makepyfile(test_scratch=SCRATCH)
    result = pytester.runpytest_inprocess("-p", "tests.conftest", "-p", "no:cacheprovider")
    outcomes = {r.nodeid.split("::")[-1]: r.outcome for r in result.reprec.getreports("pytest_runtest_logreport")
                if r.when == "call"}
    assert outcomes == {"test_spawns": "failed", "test_runs_git_and_a_dry_make": "passed", "test_spawns_marked": "passed", "test_trains": "failed",
                        "test_uses_a_spawning_fixture_first": "failed",
                        "test_uses_the_cached_fixture_later": "failed", "test_pure": "passed"}
    result.stdout.fnmatch_lines(["*test_spawns: it starts a subprocess, but it is not marked slow: mark it "
                                 "@pytest.mark.slow, or list it in tests/end_to_end.py*",
                                 "*test_trains: it starts the training loop*",
                                 "*test_uses_the_cached_fixture_later: its fixture 'spawned' starts a subprocess*"])


def test_a_kept_test_marked_slow_is_refused(pytester, monkeypatch):
    import tests.end_to_end
    pytester.makepyfile(test_kept='import pytest\n\n@pytest.mark.slow\ndef test_kept():\n    pass\n')
    monkeypatch.setitem(tests.end_to_end.KEPT, "test_kept.py::test_kept", "why")
    result = pytester.runpytest_inprocess("-p", "tests.conftest", "-p", "no:cacheprovider", "-m", "not slow")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_kept.py::test_kept is kept in the default set by tests/end_to_end.py but "
                                 "is marked slow, so `make test` would leave it out*"])


def test_the_kept_end_to_end_tests_exist_and_say_why():
    """Each entry of tests/end_to_end.py names a test pytest collects (a renamed test would otherwise
    drop out of the default set unseen)."""
    from tests.helpers.cli import ROOT

    class Collected:
        ids: set[str] = set()

        def pytest_collection_finish(self, session):
            self.ids.update(item.nodeid for item in session.items)

    files = sorted({os.path.join(ROOT, nodeid.split("::")[0]) for nodeid in KEPT})
    assert pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "--rootdir", ROOT, *files],
                       plugins=[Collected()]) == 0
    assert set(KEPT) <= Collected.ids, set(KEPT) - Collected.ids
    assert all(why.strip() for why in KEPT.values())
