"""Tests for scripts/default_run.py: the default run's page numbers read from a timed make train."""

import json

import pytest

from scripts import default_run

LOG = """.venv/bin/python train.py --config configs/modern.py --workdir runs/shakespeare
model: 853,376 parameters, 5.9 MFLOP per token (6N + 12 L T d), KV cache 4,096 bytes per token
 50%|##########| 280/560 [00:50<00:50, 5.6it/s, loss=1.9]
done: step 560 of 560 in 104 s (3.3 s compiling; 11,881 tokens/s training); val loss 1.6097 nats/token
--- sample ---
ROMEO:
WALL 107.26 s
"""


def write_run(folder, steps=560, evals=((100, 2.04812), (560, 1.60972))):
    (folder / "config.json").write_text(json.dumps({"train": {"steps": steps, "batch_size": 16, "seq_len": 128}}))
    rows = [{"step": 0, "compile_seconds": 3.3}, {"step": 25, "loss": 3.1}] + [{"step": s, "val_loss": v}
                                                                               for s, v in evals]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5')  # a cut line


def test_the_summary_reads_the_log_and_the_run(tmp_path, capsys):
    write_run(tmp_path)
    (tmp_path / "log").write_text(LOG)
    out = tmp_path / "default_run.json"
    assert default_run.main(["--log", str(tmp_path / "log"), "--workdir", str(tmp_path), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["parameters_millions"] == 0.85 and result["steps"] == 560 and result["batch_size"] == 16
    assert result["val_loss_at"] == {"100": 2.0481, "560": 1.6097} and result["val_loss"] == 1.6097
    assert result["bits_per_byte"] == 2.32  # 1.6097 / ln 2
    assert (result["command_seconds"], result["train_py_seconds"]) == (107, 104)
    assert (result["compile_seconds"], result["tokens_per_second"]) == (3.3, 11881)
    assert json.loads(capsys.readouterr().out) == result


@pytest.mark.parametrize("cut, named", [("WALL 107.26 s\n", "WALL line"), ("model: 853,376", "model line")])
def test_a_log_without_a_needed_line_is_refused(tmp_path, capsys, cut, named):
    write_run(tmp_path)
    (tmp_path / "log").write_text(LOG.replace(cut, ""))
    assert default_run.main(["--log", str(tmp_path / "log"), "--workdir", str(tmp_path)]) == 1
    assert named in capsys.readouterr().err


def test_an_unfinished_run_is_refused(tmp_path):
    with pytest.raises(ValueError, match="stopped at step 300 of 560"):
        default_run.read_log(LOG.replace("done: step 560 of 560", "done: step 300 of 560"))
    write_run(tmp_path, evals=((100, 2.0), (300, 1.8)))
    with pytest.raises(ValueError, match="no evaluation at its last step 560"):
        default_run.read_run(str(tmp_path))
