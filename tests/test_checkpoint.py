"""Checkpoint errors: missing, empty, corrupted and other-model checkpoints say what to do."""

import os

import jax
import numpy as np
import pytest

from transformer import training
from transformer.checkpoint import CheckpointError, Checkpointer, check_same_model, restore_for_inference
from transformer.config import ModelConfig
from transformer.tokenizer import ByteTokenizer

MODEL = dict(vocab_size=64, max_seq_len=16, d_model=32, num_layers=1, num_heads=2)
OPTIM = dict(learning_rate=1e-3, warmup_steps=1, min_lr_ratio=0.1, b1=0.9, b2=0.99, eps=1e-8,
             weight_decay=0.1, decay_embeddings=False, grad_clip=1.0)


def save_one(workdir):
    cfg = ModelConfig(**MODEL)
    tx, _ = training.make_optimizer(OPTIM, 10)
    state = training.create_state(cfg, tx, 0, training.make_mesh(devices=jax.devices()[:1]))
    ckpt = Checkpointer(str(workdir))
    ckpt.save(3, state, {"model": MODEL}, ByteTokenizer(), val_loss=1.0)
    ckpt.wait()
    return state


def test_round_trip_restores_params_config_and_tokenizer(tmp_path):
    state = save_one(tmp_path)
    cfg, params, tok = restore_for_inference(str(tmp_path))
    assert cfg == ModelConfig(**MODEL) and isinstance(tok, ByteTokenizer)
    jax.tree.map(np.testing.assert_array_equal, params, state.params)


def test_missing_workdir_and_empty_checkpoint_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        restore_for_inference(str(tmp_path / "nope"))
    with pytest.raises(CheckpointError, match="no checkpoints"):
        restore_for_inference(str(tmp_path))
    os.makedirs(tmp_path / "checkpoints")
    with pytest.raises(CheckpointError, match="holds no complete checkpoint"):
        restore_for_inference(str(tmp_path))


def test_corrupted_checkpoint_names_the_folder_to_delete(tmp_path):
    save_one(tmp_path)
    state_dir = tmp_path / "checkpoints" / "3" / "state"
    for root, _, files in os.walk(state_dir):
        for name in files:
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"\x00garbage")
    with pytest.raises(CheckpointError, match="could not be read") as err:
        restore_for_inference(str(tmp_path))
    assert str(tmp_path / "checkpoints" / "3") in str(err.value)


def test_other_model_is_refused_with_the_differing_fields():
    with pytest.raises(CheckpointError, match="d_model: checkpoint 32, config 64"):
        check_same_model(MODEL, dict(MODEL, d_model=64), "runs/x")
    check_same_model(MODEL, dict(MODEL), "runs/x")  # the same model passes
