"""Bad input at every entry point (issue 51): the scripts, the files a run or a Hugging Face folder holds,
and the public functions the README shows end in one clear line, or are handled right; no script writes
a committed file before its inputs are checked. In-process: the command line adds nothing to these."""

from __future__ import annotations

import json
import math
import os
import sys

import jax
import numpy as np
import pytest

from tests.helpers.decoder import make_cfg, random_params
from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_line_exit(capsys, main, argv: list[str], monkeypatch, code: int | None = None) -> str:
    """Runs a script's main() with `argv`; requires a SystemExit (non-zero, or `code`) and one line on stderr."""
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err
    assert exit_.value.code not in (0, None) and (code is None or exit_.value.code == code), (exit_.value.code, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def tiny():
    cfg = make_cfg("mha", "rope")
    return cfg, random_params(Decoder(cfg))


# ----------------------------------------------------------------------------- data loss and silent wrong results


def test_recall_sweep_checks_every_run_before_it_rewrites_the_curves_file(tmp_path, monkeypatch, capsys):
    from scripts import recall_sweep

    curves = tmp_path / "recall.json"
    curves.write_text('{"a_seed0": [[1, 2.0, 0.5]]}\n')
    monkeypatch.setattr(recall_sweep, "CURVES", str(curves))
    for name in ("a-seed0", "boom"):  # sweep.py's seeds, and a run with none
        (tmp_path / "w" / name).mkdir(parents=True)
        (tmp_path / "w" / name / "metrics.jsonl").write_text(
            json.dumps({"step": 5, "val_loss": 1.0, "val_exact_match": 0.5}) + "\n")
    err = one_line_exit(capsys, recall_sweep.main, ["recall_sweep.py", str(tmp_path / "w")], monkeypatch)
    assert "'boom' is not named <variant>-seed<s>" in err
    assert curves.read_text() == '{"a_seed0": [[1, 2.0, 0.5]]}\n'  # untouched
    (tmp_path / "w" / "boom" / "metrics.jsonl").unlink()
    monkeypatch.setattr(sys, "argv", ["recall_sweep.py", str(tmp_path / "w"), "--figure", str(tmp_path / "f.png")])
    recall_sweep.main()  # '-seed<s>' (sweep.py's naming) is read as well as '_seed<s>'
    assert json.loads(curves.read_text()) == {"a-seed0": [[5, 1.0, 0.5]]}


def test_an_integer_safetensors_tensor_is_refused_by_name(tiny, tmp_path):
    from safetensors.numpy import load_file, save_file

    from transformer.hf import from_hf, to_hf

    cfg, params = tiny
    to_hf(cfg, params, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    name = sorted(tensors)[0]
    tensors[name] = np.clip(tensors[name] * 100, -127, 127).astype(np.int8)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=f"tensor {name} in .* is I8, not a float: a quantised model"):
        from_hf(tmp_path)


def test_explore_refuses_token_ids_outside_the_vocabulary_and_prompts_past_the_context(tiny):
    from transformer.analysis.explore import explore

    cfg, params = tiny
    with pytest.raises(ValueError, match="token id 999 .* outside the vocabulary of vocab_size=64"):
        explore(params, [[999, 1000]], cfg=cfg)
    with pytest.raises(ValueError, match="the prompt has 17 tokens.*max_seq_len=16"):
        explore(params, [[1] * 17], cfg=cfg)


@pytest.mark.parametrize("argv, message", [
    (["--times", "1"], "--times 1: at least 2"), (["--times", "0"], "--times 0: at least 2"),
    (["--rows", "1"], "--rows 1: at least 2"), (["--sinks", "0,a"], "--sinks '0,a': a comma-separated list"),
])
def test_streaming_refuses_what_would_print_nan_before_loading_anything(argv, message, monkeypatch, capsys):
    from scripts import streaming

    err = one_line_exit(capsys, streaming.main, ["streaming.py", "--sweep_dir", "/nonexistent", *argv], monkeypatch, 2)
    assert message in err


@pytest.mark.parametrize("body, message", [
    ('dict(base="tiny", variants={"a": {}}, seeds=[0, 0])', "seeds=[0, 0] repeats a seed"),
    ('dict(base="tiny", variants={"a": {}}', "failed to load (SyntaxError"),
    ('[1, 2]', "get_config() returned list"),
])
def test_a_sweep_file_with_repeated_seeds_or_broken_python_is_a_sweep_error(tmp_path, body, message):
    from transformer.experiments import sweep

    path = tmp_path / "bad.py"
    path.write_text(f"def get_config():\n    return {body}\n")
    with pytest.raises(sweep.SweepError) as error:
        sweep.run_sweep(str(path), str(tmp_path / "w"))
    assert message in str(error.value) and "\n" not in str(error.value), error.value
    (tmp_path / "none.py").write_text("x = 1\n")
    with pytest.raises(sweep.SweepError, match="failed to load .AttributeError"):
        sweep.load_sweep(str(tmp_path / "none.py"))


@pytest.mark.parametrize("field, message", [
    (dict(attention_window=1000), "attention_window=1000 is longer than the context max_seq_len=16"),
    (dict(norm_eps=math.nan), "norm_eps=nan must be positive and finite"),
    (dict(rope_theta=math.inf), "rope_theta=inf must be positive and finite"),
])
def test_model_fields_that_would_compute_nonsense_are_refused(field, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        make_cfg("mha", "rope", **field)
    assert make_cfg("mha", "rope", attention_window=16).attention_window == 16  # the whole context: allowed
