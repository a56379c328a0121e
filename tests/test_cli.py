"""Tests of transformer/cli.py, called directly: which --config file argv names, the closest valid
field to a mistyped one, and the field names of a config. (tests/test_train_inputs.py runs the
same through train.py.)"""

from __future__ import annotations

import os

import pytest

from configs import tiny
from transformer.cli import config_path, explain_flag_error
from transformer.run.config_files import closest_field, leaf_fields

DEFAULT = "/repo/configs/shakespeare.py"
FIELDS = leaf_fields(tiny.get_config())


@pytest.mark.parametrize("argv, path", [
    (["train.py"], None),
    (["train.py", "--workdir", "runs/x"], None),
    (["train.py", "--config=configs/tiny.py"], "configs/tiny.py"),
    (["train.py", "--config", "configs/tiny.py", "--config.train.steps=3"], "configs/tiny.py"),
    (["train.py", "--config.train.steps=3", "--config=a=b.py"], "a=b.py"),  # split at the first '='
    (["train.py", "--config.train.steps=3"], None),  # an override is not the file
    (["train.py", "--config"], None),  # no value after it: absl reports that
    (["train.py", f"--config={DEFAULT}"], DEFAULT),  # the default, named: the parser adds no second one
])
def test_config_path(argv, path):
    assert config_path(argv) == path


def test_the_first_config_flag_wins():
    assert config_path(["train.py", "--config=a.py", "--config", "b.py"]) == "a.py"


@pytest.mark.parametrize("name, closest", [
    ("train.stpes", "train.steps"),
    ("model.num_head", "model.num_heads"),
    ("optim.learning_rat", "optim.learning_rate"),
    ("trian.steps", "train.steps"),  # an unknown section: the closest full name
    ("train.zzzz", None),  # nothing close in its section
    ("bogus.x", None),
])
def test_closest_field(name, closest):
    assert closest_field(name, FIELDS) == closest


def test_closest_field_stays_in_the_section():
    """Only a sibling in the named section, even when another section holds the same leaf."""
    fields = ["train.steps", "optim.learning_rate"]
    assert closest_field("optim.steps", fields) is None
    assert closest_field("optim.step", fields) is None
    assert closest_field("train.step", fields) == "train.steps"
    assert closest_field("other.steps", fields) == "train.steps"  # no such section: full names


def test_leaf_fields_are_every_field_dotted():
    assert {"train.steps", "model.d_model", "data.vocab_size", "mesh.fsdp", "init_from_hf"} <= set(FIELDS)
    assert not any(name in ("train", "model", "data", "optim", "mesh") for name in FIELDS)
    assert len(FIELDS) == len(set(FIELDS))


def test_explain_flag_error_names_the_closest_field_or_the_error():
    path = os.path.abspath(tiny.__file__)
    argv = ["train.py", f"--config={path}", "--config.train.stpes=3"]
    assert explain_flag_error(path, argv, KeyError("stpes")) == (
        "unknown config field config.train.stpes; did you mean config.train.steps?")
    argv = ["train.py", "--config.bogus.x=1"]
    assert explain_flag_error(path, argv, KeyError("bogus")) == (
        "unknown config field config.bogus.x; configs/common.py lists the fields")
    argv = ["train.py", "--config.train.steps=abc"]  # a known field: the error's first line
    assert explain_flag_error(path, argv, ValueError("bad value\nmore")) == "bad value"
    assert explain_flag_error(path, argv, ValueError("")) == "ValueError"


def test_explain_flag_error_on_a_config_file_that_returns_a_dict(tmp_path):
    path = tmp_path / "dict_config.py"
    path.write_text("def get_config():\n    return {'train': {'steps': 3}}\n")
    assert explain_flag_error(str(path), ["train.py", "--config.train.steps=4"], KeyError("x")) == (
        f"config file {path}: get_config() returned dict, not an ml_collections ConfigDict; "
        "build it with configs/common.base_config")


def test_explain_flag_error_on_a_broken_config_file(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def get_config():\n    return 1 / 0\n")
    assert explain_flag_error(str(broken), ["train.py"], KeyError("x")) == (
        f"the config file {str(broken)!r} failed to load: ZeroDivisionError: division by zero")


def test_a_known_error_is_one_line_unless_the_traceback_is_asked_for(capsys, monkeypatch):
    from transformer.cli import TRACEBACK, exit_with_error

    monkeypatch.delenv(TRACEBACK, raising=False)
    with pytest.raises(SystemExit) as code:
        exit_with_error(ValueError("train.steps=0 must be a positive integer"), 2)
    assert code.value.code == 2 and capsys.readouterr().err == "error: train.steps=0 must be a positive integer\n"
    monkeypatch.setenv(TRACEBACK, "1")  # for a bug report: the error itself, with its traceback
    with pytest.raises(ValueError, match="must be a positive integer"):
        exit_with_error(ValueError("train.steps=0 must be a positive integer"))
    assert capsys.readouterr().err == ""
