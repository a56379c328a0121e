"""configs/sweeps/recall.py, the seed sweep behind configs/recall.py's recipe, and scripts/recall_sweep.py,
its table: each variant is the recipe with exactly the changes its name says, and the table counts the
seeds that reach 0.9 and the step at which each first did."""

from __future__ import annotations

import json
import os

import pytest

from configs import recall
from scripts import recall_sweep
from transformer.experiments import sweep
from transformer.run.config_files import flat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = os.path.join(ROOT, "configs", "sweeps", "recall.py")
PRECISE = {"model.dtype", "model.attention_impl", "train.checkpoint_every", "train.keep_checkpoints", "train.seed"}


def differing(a, b) -> dict:
    """{dotted field: (a's value, b's value)} where two configs differ."""
    fa, fb = flat(a.to_dict()), flat(b.to_dict())
    return {k: (fa.get(k), fb.get(k)) for k in set(fa) | set(fb) if fa.get(k) != fb.get(k)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    jobs = sweep.plan(sweep.load_sweep(SWEEP), SWEEP, str(tmp_path_factory.mktemp("recall_sweep")))
    return {job.name: job.config for job in jobs}


def test_the_sweep_lists_the_32_runs_of_the_table_and_the_curves_file_holds_each(runs):
    assert len(runs) == 32
    curves = json.load(open(recall_sweep.CURVES))
    assert list(curves) == list(runs)  # the same runs, in the file's order
    for name, config in runs.items():
        assert curves[name][-1][0] == config.train.steps, name  # every run's curve ends at its last step
        assert config.train.seed == int(name.rpartition("_seed")[2])


def test_the_recipe_runs_are_configs_recall_and_before_is_the_old_recipe(runs):
    now = recall.get_config()
    assert set(differing(runs["recipe_seed3"], now)) <= PRECISE
    before = differing(runs["before_seed0"], runs["recipe_seed0"])
    assert set(before) - PRECISE == {"model.attention_window", "model.global_every", "data.needle.questions",
                                     "train.seq_len", "train.steps", "train.eval_every"}
    assert before["model.attention_window"] == (0, 16) and before["data.needle.questions"] == (1, 3)
    one_change = differing(runs["before_window_16_seed1"], runs["before_seed1"])
    assert set(one_change) == {"model.attention_window", "model.global_every"}
    assert set(differing(runs["recipe_window_8_seed0"], runs["recipe_seed0"])) == {"model.attention_window"}


def test_the_table_counts_seeds_past_0_9_and_the_first_step_each_got_there():
    curves = {"a_seed0": [[100, 2.0, 0.1], [200, 0.1, 0.95], [300, 0.0, 0.99]],
              "a_seed1": [[100, 2.0, 0.3], [200, 0.4, 0.33], [300, 0.4, 0.35]],
              "b_seed4": [[100, 1.0, 0.9], [200, 0.0, 1.0]]}
    assert recall_sweep.first_at(curves["a_seed0"], 0.9) == 200
    assert recall_sweep.first_at(curves["a_seed1"], 0.9) is None
    rows = recall_sweep.table(curves).splitlines()[2:]
    assert rows == ["| a | 2 | 300 | 0.990, 0.350 | 200, - | 1 of 2 |",
                    "| b | 1 | 200 | 1.000 | 100 | 1 of 1 |"]


def test_reading_runs_takes_each_folders_evaluations_and_an_empty_folder_is_an_error(tmp_path):
    run = tmp_path / "x_seed2"
    run.mkdir()
    run.joinpath("metrics.jsonl").write_text(
        json.dumps({"step": 5, "loss": 2.0}) + "\n"
        + json.dumps({"step": 5, "val_loss": 1.23456, "val_exact_match": 0.5}) + "\n")
    assert recall_sweep.read_runs(str(tmp_path)) == {"x_seed2": [[5, 1.235, 0.5]]}
    with pytest.raises(SystemExit, match="holds no run folder with metrics.jsonl"):
        recall_sweep.read_runs(str(tmp_path / "nothing"))
