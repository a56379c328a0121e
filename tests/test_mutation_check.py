"""Tests of scripts/mutation_check.py's own logic, without running it (`make mutation-check` does):
its edits still match the code, an edit that matches zero or two times is an error, and a run
that imported the original tree instead of the copy is seen."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from scripts import mutation_check
from scripts.mutation_check import MUTANTS, CheckError, Mutant, foreign_modules, mutated

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_each_edit_matches_the_code_once_and_leaves_valid_python(mutant):
    """A refactor that moves the mutated line fails here, in the fast suite, by the mutant's name;
    and a mutant must change behaviour, not break the import (a syntax error is no mutant)."""
    text = (ROOT / mutant.path).read_text()
    changed = mutated(text, mutant)
    assert changed != text
    ast.parse(changed, mutant.path)
    for nodeid in mutant.tests:  # the targeted tests exist: file and function
        file, name = nodeid.split("[")[0].split("::")
        assert f"def {name}(" in (ROOT / file).read_text(), nodeid


@pytest.mark.parametrize("times", [0, 2])
def test_an_edit_that_does_not_match_exactly_once_names_the_mutant_and_its_text(times):
    mutant = Mutant("probe", "what", "x.py", old="a = 1", new="a = 2", tests=())
    with pytest.raises(CheckError, match=rf"'probe'.*\n +a = 1\n.*found {times}"):
        mutated("b = 0\n" + "a = 1\n" * times, mutant)


def test_modules_imported_from_outside_the_copy_are_named(tmp_path):
    copy = tmp_path / "copy"
    modules = {
        "transformer": str(copy / "transformer/__init__.py"),
        "transformer.model.ops": "/work/main/transformer/model/ops.py",
        "transformer.namespace": None,  # no file: nothing to check
    }
    assert foreign_modules(modules, copy) == ["transformer.model.ops from /work/main/transformer/model/ops.py"]
    assert mutation_check.module_name("transformer/model/kv_cache.py") == "transformer.model.kv_cache"
