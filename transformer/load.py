"""A model in one call, its 'auto' execution fields chosen for the backend at hand:

    cfg = transformer.config_from_file("configs/gpt2.py")       # a ModelConfig, ready to build
    cfg, params, tokenizer = transformer.load_run("runs/shakespeare")             # latest checkpoint
    cfg, params, tokenizer = transformer.load_run("runs/shakespeare/checkpoints/200")  # that one
    tokens = transformer.validation_tokens("runs/shakespeare")  # [N]: the split its evaluations read"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer.model.config import ModelConfig
from transformer.model.execution import resolve_auto
from transformer.run.config_files import load_config


def config_from_file(path: str, **overrides: Any) -> ModelConfig:
    """The model of a config file (a configs/*.py with get_config()), as a ModelConfig whose
    'auto' fields are chosen for this process's backend. overrides: model fields to change."""
    return model_config(load_config(path).model, **overrides)


def model_config(fields: Mapping[str, Any], **overrides: Any) -> ModelConfig:
    """A ModelConfig from a config's `model` fields (a dict or ConfigDict), 'auto' resolved."""
    cfg = ModelConfig.from_dict({**dict(fields), **overrides})
    return resolve_auto(cfg).cfg


_CHECKPOINT = re.compile(r"^(?P<workdir>.+)/checkpoints/(?P<step>\d+)/?$")


def load_run(path: str, step: int | None = None) -> tuple[ModelConfig, Any, Any]:
    """(model config, params, tokenizer) of a training run: `path` is its folder (checkpoint
    `step`, default the latest) or one checkpoint folder, RUN/checkpoints/STEP."""
    from transformer.run.checkpoint import restore_for_inference

    if not isinstance(path, (str, os.PathLike)) or not (step is None or isinstance(step, int)):
        raise TypeError(f"load_run(path, step) takes a run's folder and an int step, not {path!r}, {step!r}")
    match = _CHECKPOINT.match(os.path.normpath(path))
    if match:
        if step is not None and step != int(match["step"]):
            raise ValueError(f"{path} is the checkpoint of step {match['step']}, not step {step}")
        return restore_for_inference(match["workdir"], step=int(match["step"]))
    return restore_for_inference(path, step=step)


def validation_tokens(workdir: str) -> np.ndarray:
    """[N] token ids: the validation split a run's evaluations read (its saved data fields and tokenizer)."""
    from transformer.data.corpus import load_corpus
    from transformer.run.checkpoint import Checkpointer

    ckpt = Checkpointer(workdir, read_only=True)
    data = ckpt.config()["data"]
    return np.asarray(load_corpus(data["path"] or None, ckpt.tokenizer(), data["cache_dir"], data["val_fraction"]).val)


def load_model(workdir: str | None, hf_dir: str | None, step: int | None) -> tuple[ModelConfig, Any, Any]:
    """(model config, params, tokenizer) from a training run's workdir (checkpoint `step`, default
    the latest) or a Hugging Face model folder: exactly one of the two. What the command lines of
    sample.py and `python -m transformer.explore` load."""
    if (workdir is None) == (hf_dir is None):
        raise ValueError("give exactly one of --workdir (a training run) or --hf_dir (a Hugging Face model)")
    if hf_dir is None:
        cfg, params, tokenizer = load_run(workdir, step=step)
        if cfg.inputs == "table":  # no tokenizer, no text: nothing to sample or explore
            raise ValueError(f"{workdir} holds a table model (model.inputs='table'): it classifies the rows of a table "
                             "and reads no text; evaluate it with python scripts/eval_tables.py " + workdir)
        return cfg, params, tokenizer
    # Imported here: only this branch needs the Hugging Face conversion code.
    from transformer.data.tokenizer import load_tokenizer
    from transformer.hf import from_hf

    cfg, params = from_hf(hf_dir)
    try:
        return cfg, params, load_tokenizer(hf_dir)
    except Exception as e:  # missing or garbled: the json and tokenizers libraries name no file
        raise ValueError(f"{hf_dir}: the tokenizer files (tokenizer_kind.json, tokenizer.json) cannot be read "
                         f"({type(e).__name__}: {e}); copy them again from where the model came from") from None
