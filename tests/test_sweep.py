"""Sweeps (transformer/experiments/sweep.py, sweep.py): configs/sweeps/tiny.py (two variants of configs/tiny.py, 8 steps each) trained in this
process, its table and figure, skipping finished runs, resuming a killed one; the sweep file's
errors; and the lecture sweep's variants and matched parameter counts (planned, not trained)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
from types import SimpleNamespace

import subprocess
import sys

import pytest

from transformer.experiments import sweep
from transformer.experiments.catalog import train
from transformer.experiments.sweep import num_params
from transformer.model.execution import resolve_auto
from transformer.model.config import ModelConfig
from transformer.run.metrics import read_metrics
from transformer.training.setup import resolve

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "sweeps", "tiny.py")
LECTURE = os.path.join(ROOT, "configs", "sweeps", "lecture.py")
RECIPE = os.path.join(ROOT, "configs", "sweeps", "recipe.py")
FEWER = os.path.join(ROOT, "configs", "sweeps", "fewer_tokens.py")
FEWER_SEEDS = os.path.join(ROOT, "configs", "sweeps", "fewer_tokens_seeds.py")
FEWER_BYTES = os.path.join(ROOT, "configs", "sweeps", "fewer_bytes_shorter.py")


def run_sweep(workdir, extra) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = sweep.run_sweep(TINY, str(workdir), extra)
    return code, out.getvalue()


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """The tiny sweep after a kill: `baseline` trained 4 of its 8 steps on its own (train.run_steps
    stops a run early with a checkpoint, as a killed sweep leaves it), then the sweep, then the
    sweep again."""
    workdir = tmp_path_factory.mktemp("sweep")
    extra = {"data.cache_dir": str(tmp_path_factory.mktemp("tokens"))}
    baseline = sweep.plan(sweep.load_sweep(TINY), TINY, str(workdir), extra)[0]
    config = copy.deepcopy(baseline.config)
    config.train.run_steps = 4
    with contextlib.redirect_stdout(io.StringIO()):
        train(config, baseline.workdir, progress=False)
    first = run_sweep(workdir, extra)
    metrics = {name: read(workdir / name / "metrics.jsonl") for name in ("baseline", "attention_only")}
    second = run_sweep(workdir, extra)
    return SimpleNamespace(workdir=workdir, extra=extra, first=first, second=second, metrics=metrics)


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_checkpoint(swept):
    code, out = swept.first
    assert code == 0, out
    assert "baseline (the base): resuming at step 4 of 8" in out
    assert "resumed from the checkpoint at step 4" in out
    rows = read_metrics(os.path.join(swept.workdir, "baseline", "metrics.jsonl"))
    assert [r["step"] for r in rows if "loss" in r] == [2, 4, 6, 8]  # continued, not started over
    assert "attention_only (model.mlp_dim=0): 8 steps" in out


def test_the_table_has_every_run_and_the_figure_is_written(swept):
    table = read(swept.workdir / "results.md").decode()
    rows = {line.split(" | ")[0][2:]: line for line in table.splitlines() if line.startswith("| ")}
    assert {"baseline", "attention_only"} <= set(rows)
    for name in ("baseline", "attention_only"):
        assert rows[name].endswith("| done |")
        with open(swept.workdir / name / "config.json") as f:
            assert f"{num_params(ModelConfig.from_dict(json.load(f)['model'])):,}" in rows[name]
    assert "`model.mlp_dim=0`" in rows["attention_only"] and "(-38.2%)" in rows["attention_only"]
    wall = [r["wall_seconds"] for r in read_metrics(swept.workdir / "attention_only" / "metrics.jsonl")
            if "wall_seconds" in r]
    assert len(wall) == 1 and wall[0] > 0
    assert read(swept.workdir / "val_loss.png")[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_rerun_skips_the_finished_runs(swept):
    code, out = swept.second
    assert code == 0, out
    assert "[1/2] baseline: skipped, finished at step 8" in out
    assert "[2/2] attention_only: skipped, finished at step 8" in out
    assert "model:" not in out  # nothing was set up or compiled
    for name, before in swept.metrics.items():
        assert read(swept.workdir / name / "metrics.jsonl") == before


@pytest.mark.slow
def test_a_run_folder_of_another_config_is_refused(swept):
    changed = {**swept.extra, "optim.learning_rate": 1e-4}
    with pytest.raises(sweep.SweepError, match=r"baseline was trained with another config \(optim.learning_rate"):
        sweep.plan(sweep.load_sweep(TINY), TINY, str(swept.workdir), changed)


@pytest.mark.parametrize("sweep_file, message", [
    ('dict(base="tiny", variants={"rms": {"model.nrom": "rmsnorm"}})',
     "variant 'rms': unknown config field model.nrom; did you mean model.norm?"),
    ('dict(base="tiny", variants={"a": {"trian.steps": 3}})',
     "variant 'a': unknown config field trian.steps; did you mean train.steps?"),
    ('dict(base="shakespear", variants={"a": {}})', "did you mean 'shakespeare'?"),
    ('dict(base="tiny", variant={"a": {}})', "unknown key 'variant'; did you mean 'variants'?"),
    ('dict(base="tiny", variants={"a": {"model.num_kv_heads": 3}})', "variant 'a': ModelConfig: num_heads=4"),
    ('dict(base="tiny", variants={"a": {}}, seeds=[0, 0])', "seeds=[0, 0] repeats a seed"),
    ('dict(base="tiny", variants={"a": {}}', "failed to load (SyntaxError"),
    ('[1, 2]', "get_config() returned list"),
])
def test_a_bad_sweep_file_is_a_one_line_error(tmp_path, sweep_file, message):
    path = tmp_path / "bad.py"
    path.write_text(f"def get_config():\n    return {sweep_file}\n")
    with pytest.raises(sweep.SweepError) as error:
        sweep.run_sweep(str(path), str(tmp_path / "w"))
    assert message in str(error.value) and "\n" not in str(error.value), error.value
    assert not (tmp_path / "w").exists()


def test_a_sweep_file_without_get_config_is_a_sweep_error(tmp_path):
    (tmp_path / "none.py").write_text("x = 1\n")
    with pytest.raises(sweep.SweepError, match="failed to load .AttributeError"):
        sweep.load_sweep(str(tmp_path / "none.py"))


def test_the_command_line_reports_a_bad_sweep_file_in_one_line_and_exits_2(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text('def get_config():\n    return dict(base="tiny", variant={"a": {}})\n')
    out = subprocess.run([sys.executable, os.path.join(ROOT, "sweep.py"), "--sweep", str(path), "--workdir",
                          str(tmp_path / "w")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr == "error: " + f"{path}: unknown key 'variant'; did you mean 'variants'?\n"
    assert not (tmp_path / "w").exists()


def test_the_lecture_sweep_changes_one_thing_per_variant_at_matched_parameter_counts(tmp_path):
    jobs = sweep.plan(sweep.load_sweep(LECTURE), LECTURE, str(tmp_path))
    models = {job.name: resolve_auto(ModelConfig.from_dict(resolve(job.config, "").model)).cfg for job in jobs}
    params = {name: num_params(cfg) for name, cfg in models.items()}
    assert len(jobs) == 12 and jobs[0].name == "baseline" and params["baseline"] == 842_496
    for job in jobs:
        assert job.config.train.steps == 300
        changed = set(models[job.name].differences(models["baseline"])) - models[job.name].derived
        assert changed == {k.split(".")[1] for k in job.changes}  # the variant's fields, nothing else
    assert {name: params[name] for name in ("gqa", "mqa", "mla")} == {"gqa": 842_240, "mqa": 842_112, "mla": 842_112}
    for name in ("layernorm_plain", "rmsnorm", "postnorm", "gqa", "mqa", "mla"):
        assert abs(params[name] / params["baseline"] - 1) < 0.01, name
    assert {name: params[name] for name in ("sinusoidal", "rope", "no_positions")} == dict.fromkeys(
        ("sinusoidal", "rope", "no_positions"), 842_496 - 128 * 128)  # the learned position table
    assert (models["mla"].kv_latent_dim, models["mqa"].num_kv_heads) == (64, 1)


def test_the_second_seed_repeats_the_close_calls_with_seed_1():
    from configs.sweeps import lecture, lecture_seed1

    first, second = lecture.get_config(), lecture_seed1.get_config()
    assert second["overrides"] == {**first["overrides"], "train.seed": 1}
    assert list(second["variants"]) == list(lecture_seed1.CLOSE)
    assert all(second["variants"][name] == first["variants"][name] for name in lecture_seed1.CLOSE)


def test_the_recipe_sweep_takes_out_one_piece_of_the_default_recipe_per_variant(tmp_path):
    """configs/sweeps/recipe.py: `recipe` is the default recipe itself (at 200 steps); every other
    variant's model differs from it in the fields it names and nothing else, and a variant that puts
    back a lecture-GPT choice puts back configs/shakespeare.py's value."""
    from configs import modern, shakespeare

    jobs = sweep.plan(sweep.load_sweep(RECIPE), RECIPE, str(tmp_path))
    model = lambda config: resolve_auto(ModelConfig.from_dict(config.model)).cfg  # noqa: E731
    configs = {job.name: resolve(job.config, "") for job in jobs}
    models = {name: model(config) for name, config in configs.items()}
    assert jobs[0].name == "recipe" and not jobs[0].changes and len(jobs) == 13
    assert models["recipe"] == model(modern.get_config())
    lecture = shakespeare.get_config()
    for job in jobs:
        assert configs[job.name].train.steps == (400 if job.name == "batch_16" else 200)
        fields = {k.split(".")[1] for k in job.changes if k.startswith("model.")}
        assert set(models[job.name].differences(models["recipe"])) - models[job.name].derived == fields, job.name
    for name, field in (("learned_positions", "position"), ("layernorm", "norm"), ("biases", "use_bias"),
                        ("gelu", "activation"), ("no_qk_norm", "qk_norm"), ("tied_head", "tie_embeddings")):
        assert getattr(models[name], field) == lecture.model[field], name
    assert configs["adamw"].optim.name == lecture.optim.name == "adamw"
    assert configs["cosine"].optim.schedule == lecture.optim.schedule


def test_the_fewer_tokens_sweep_trains_the_default_model_on_fewer_bytes(tmp_path):
    """configs/sweeps/fewer_tokens.py: `recipe` is configs/modern_b32.py itself (the default when it
    ran); every other variant keeps its model and sequence length and trains on fewer bytes (batch x
    steps); the seeds file repeats three of its variants, unchanged, on seeds 0, 1 and 2."""
    from configs import modern_b32

    jobs = sweep.plan(sweep.load_sweep(FEWER), FEWER, str(tmp_path / "one"))
    configs = {job.name: resolve(job.config, "") for job in jobs}
    model = lambda config: resolve_auto(ModelConfig.from_dict(config.model)).cfg  # noqa: E731
    default = modern_b32.get_config()
    tokens = lambda t: t.batch_size * t.steps * t.seq_len  # noqa: E731
    assert jobs[0].name == "recipe-seed0" and not jobs[0].changes
    assert tokens(configs["recipe-seed0"].train) == tokens(default.train)
    for name, config in configs.items():
        assert config.train.seq_len == default.train.seq_len and config.optim.name == "muon", name
        if name != "recipe-seed0":
            assert tokens(config.train) < tokens(default.train), name
            assert set(model(config).differences(model(default))) <= {"logit_softcap"}, name
    seeded = sweep.plan(sweep.load_sweep(FEWER_SEEDS), FEWER_SEEDS, str(tmp_path / "three"))
    assert sorted(job.name for job in seeded) == sorted(f"{v}-seed{s}" for v in ("recipe", "b16_d70",
                                                                              "b16_d50_momentum_09")
                                                        for s in (0, 1, 2))
    for job in seeded:
        variant = job.name.rsplit("-seed", 1)[0]
        assert job.config.train.seed == int(job.name[-1])
        assert job.changes == next(j for j in jobs if j.name == f"{variant}-seed0").changes


def test_the_default_run_is_the_sweep_variant_that_matched_the_old_default(tmp_path):
    """configs/modern.py is configs/sweeps/fewer_bytes_shorter.py's `b16_x560` (the variant whose loss
    matched the old default's over three seeds) with the sweep's own logging overrides put back, and
    configs/modern_b32.py, that sweep's base, is the old default: the same model and rates on 10/7 the
    bytes. A change to either config that the sweep did not measure fails here."""
    from configs import modern, modern_b32

    jobs = {job.name: job for job in sweep.plan(sweep.load_sweep(FEWER_BYTES), FEWER_BYTES, str(tmp_path))}
    measured, default, old = (resolve(c, "").to_dict() for c in (jobs["b16_x560-seed0"].config,
                                                                  modern.get_config(), modern_b32.get_config()))
    logging = ("eval_every", "checkpoint_every", "sample_tokens", "seed")
    for name in ("model", "optim", "data"):
        assert measured[name] == default[name], name
    assert {k: v for k, v in measured["train"].items() if k not in logging} == \
        {k: v for k, v in default["train"].items() if k not in logging}
    assert old["model"] == default["model"] and old["data"] == default["data"]
    assert {k for k in default["optim"] if default["optim"][k] != old["optim"][k]} == {"decay_fraction", "muon_momentum"}
    tokens = lambda t: t["batch_size"] * t["steps"] * t["seq_len"]  # noqa: E731
    assert tokens(default["train"]) * 10 == tokens(old["train"]) * 7


def test_a_base_config_that_is_not_a_config_dict_is_a_sweep_error(tmp_path):
    base = tmp_path / "base.py"
    base.write_text("def get_config():\n    return {'train': {'steps': 3}}\n")
    path = tmp_path / "sweep.py"
    path.write_text(f"def get_config():\n    return dict(base={str(base)!r}, variants={{'a': {{}}}})\n")
    with pytest.raises(sweep.SweepError, match=r"sweep base: config file .*base.py: get_config\(\) returned dict"):
        sweep.plan(sweep.load_sweep(str(path)), str(path), str(tmp_path / "w"))
