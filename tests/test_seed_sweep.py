"""Tests for scripts/seed_sweep.py: a seed sweep's final losses paired by seed against a baseline."""

import json

import pytest

from scripts import seed_sweep


def write_run(folder, name: str, losses: list[tuple[int, float]], steps: int | None = None) -> None:
    run = folder / name
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"train": {"steps": steps or max(s for s, _ in losses)}}))
    rows = [{"step": 0, "compile_seconds": 1.0}] + [{"step": s, "val_loss": v} for s, v in losses]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def sweep(tmp_path):
    for seed, (base, new) in enumerate([(1.62, 1.60), (1.60, 1.61), (1.61, 1.59)]):
        write_run(tmp_path, f"recipe-seed{seed}", [(100, 2.0), (400, base)])
        write_run(tmp_path, f"short-seed{seed}", [(300, 1.7), (600, new), (500, 1.65)])  # the last step's, not the last row's
    write_run(tmp_path, "short-seed3", [(300, 1.7)], steps=600)  # unfinished: left out
    (tmp_path / "logs").mkdir()  # sweep.py's log folder: not a run
    return tmp_path


def test_each_variant_is_paired_by_seed_with_the_baseline(sweep, capsys):
    out = sweep / "result.json"
    assert seed_sweep.main([str(sweep), "--baseline", "recipe", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    short = result["variants"]["short"]
    assert short["val_loss"] == [1.60, 1.61, 1.59] and short["max"] == 1.61
    assert short["differences"] == [-0.02, 0.01, -0.02] and short["mean_difference"] == pytest.approx(-0.01)
    assert short["interval"][0] <= -0.02 + 1e-9 and short["interval"][1] >= 0.01 - 1e-9
    assert short["verdict"] == "no difference"  # the interval holds 0
    assert "verdict" not in result["variants"]["recipe"] and result["seeds"] == [0, 1, 2]
    assert "| short | 1.6000 / 1.6100 / 1.5900 | 1.6000 | 1.6100 |" in capsys.readouterr().out


def test_a_consistent_difference_is_a_verdict(tmp_path):
    for seed in range(3):
        write_run(tmp_path, f"base-seed{seed}", [(10, 2.0 + seed / 100)])
        write_run(tmp_path, f"worse-seed{seed}", [(10, 2.1 + seed / 100 + seed / 1000)])
    result = seed_sweep.compare(seed_sweep.final_losses(str(tmp_path)), "base")
    assert result["variants"]["worse"]["verdict"] == "worse"


def test_an_unfinished_variant_or_a_missing_baseline_is_refused(sweep, capsys):
    (sweep / "short-seed2" / "config.json").write_text(json.dumps({"train": {"steps": 700}}))  # stopped at 600
    assert seed_sweep.main([str(sweep), "--baseline", "recipe"]) == 1
    assert "'short' has no finished run for seeds [2]" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no finished run of the baseline 'nothing'"):
        seed_sweep.compare(seed_sweep.final_losses(str(sweep)), "nothing")


def test_a_missing_folder_is_named(tmp_path, capsys):
    assert seed_sweep.main([str(tmp_path / "nothing"), "--baseline", "recipe"]) == 1
    assert "no sweep folder" in capsys.readouterr().err
