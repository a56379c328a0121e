"""Checkpoint errors: missing, empty, corrupted and other-model checkpoints say what to do."""

import logging
import os
import shutil

import jax
import numpy as np
import pytest

from tests.helpers.marks import first_fast
from transformer import training
from transformer.run.checkpoint import CheckpointError, Checkpointer, check_same_model, restore_for_inference
from transformer.model.config import ModelConfig
from transformer.training.optimizer import make_optimizer
from transformer.training.sharding import make_mesh
from transformer.data.tokenizer import ByteTokenizer

MODEL = dict(vocab_size=64, max_seq_len=16, d_model=32, num_layers=1, num_heads=2)
OPTIM = dict(learning_rate=1e-3, warmup_steps=1, min_lr_ratio=0.1, b1=0.9, b2=0.99, eps=1e-8,
             weight_decay=0.1, decay_embeddings=False, grad_clip=1.0)


def save_one(workdir):
    cfg = ModelConfig(**MODEL)
    tx, _ = make_optimizer(OPTIM, 10)
    state = training.create_state(cfg, tx, 0, make_mesh(devices=jax.devices()[:1]))
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
    with pytest.raises(CheckpointError, match="is damaged.*move it aside") as err:
        restore_for_inference(str(tmp_path))
    assert f"(mv {tmp_path / 'checkpoints' / '3'} " in str(err.value)
    assert "no earlier checkpoint is left, so start a new --workdir" in str(err.value)


def save_two(workdir):
    """Checkpoints 3 and 5 of one model; returns the state saved."""
    cfg = ModelConfig(**MODEL)
    tx, _ = make_optimizer(OPTIM, 10)
    state = training.create_state(cfg, tx, 0, make_mesh(devices=jax.devices()[:1]))
    ckpt = Checkpointer(str(workdir))
    for step in (3, 5):
        ckpt.save(step, state, {"model": MODEL}, ByteTokenizer(), val_loss=1.0)
    ckpt.wait()
    return state


@pytest.mark.parametrize("remove, named", [
    (["state/ocdbt.process_0/d/*"], "missing state/ocdbt.process_0/d (the arrays' data)"),
    (["state/_METADATA", "state/manifest.ocdbt"], "missing state/_METADATA, state/manifest.ocdbt"),
    (["tokenizer"], "missing tokenizer/metadata"),
])
def test_a_checkpoint_missing_a_part_is_named_with_the_way_back(tmp_path, remove, named):
    """Each damage once read 'not known to be damaged: keep them'; now the missing part is named
    and moving the step aside falls back to the previous complete checkpoint."""
    state = save_two(tmp_path)
    step_dir = tmp_path / "checkpoints" / "5"
    for pattern in remove:
        for path in step_dir.glob(pattern):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    with pytest.raises(CheckpointError) as err:
        restore_for_inference(str(tmp_path))
    assert str(err.value) == (f"checkpoint step 5 in {tmp_path / 'checkpoints'} is damaged ({named}): move it aside "
                              f"(mv {step_dir} {step_dir}.damaged); the same command then uses step 3, the previous "
                              "complete checkpoint")
    step_dir.rename(f"{step_dir}.damaged")
    _, params, _ = restore_for_inference(str(tmp_path))
    jax.tree.map(np.testing.assert_array_equal, params, state.params)


def test_an_unreadable_checkpoint_is_reported_on_one_line(tmp_path):
    """TensorStore can put a whole traceback inside its message; the error keeps its first line."""
    ckpt = Checkpointer(str(tmp_path))
    inner = ValueError('OUT_OF_RANGE: Error reading "x/.zarray"\nTraceback (most recent call last):\n  File "a.py"')
    err = ckpt._unreadable(2, inner)
    assert "\n" not in str(err) and "is damaged" in str(err) and 'Error reading "x/.zarray"' in str(err)
    assert "\n" not in str(ckpt._unreadable(2, ValueError("\n\nshape mismatch\nmore")))


def test_other_model_is_refused_with_the_differing_fields():
    with pytest.raises(CheckpointError, match="d_model: checkpoint 32, config 64"):
        check_same_model(MODEL, dict(MODEL, d_model=64), "runs/x")
    check_same_model(MODEL, dict(MODEL), "runs/x")  # the same model passes


def test_checkpoint_in_the_old_weight_layout_is_refused_with_the_reason(tmp_path):
    """A checkpoint whose kernels are stored [in, out] (before transformer/model/linear.py) is refused
    with what differs and what to do, at inference and at resume, and is left as it was."""
    state = save_one(tmp_path / "new")
    old = jax.tree_util.tree_map_with_path(  # [L, F, D] -> [L, D, F]
        lambda p, a: a.swapaxes(-1, -2) if jax.tree_util.keystr(p).endswith("['fc_in']['kernel']") else a, state.params
    )
    ckpt = Checkpointer(str(tmp_path / "old"))
    ckpt.save(3, state.replace(params=old), {"model": MODEL}, ByteTokenizer(), val_loss=1.0)
    ckpt.wait()
    with pytest.raises(CheckpointError, match=r"fc_in'\]\['kernel'\]: got \(1, 32, 128\), model \(1, 128, 32\).*\[out, in\]"):
        restore_for_inference(str(tmp_path / "old"))
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state)
    resume = Checkpointer(str(tmp_path / "old"))
    restored = []  # what the manager was asked to restore: the layout is checked from metadata first
    manager_restore = resume.manager.restore
    resume.manager.restore = lambda step, args: (
        restored.append(list(args.keys())) or manager_restore(step, args=args)
    )
    with pytest.raises(CheckpointError, match=r"another layout.*train again"):
        resume.restore_state(abstract, MODEL)
    assert restored == [["config"]]  # no attempt to read the arrays into the wrong shapes
    assert Checkpointer(str(tmp_path / "old"), read_only=True).all_steps() == [3]


def test_execution_changes_are_returned_not_refused():
    changes = check_same_model(MODEL, dict(MODEL, dtype="bfloat16", remat=True), "runs/x")
    assert changes == ["dtype: 'float32' -> 'bfloat16'", "remat: False -> True"]


def test_init_changes_are_returned_not_refused_and_recipe_options_are_refused():
    """zero_init_out says how a random init starts: a checkpoint resumes with either value. qk_norm
    and a logit soft-cap change what the parameters compute."""
    assert check_same_model(MODEL, dict(MODEL, zero_init_out=True), "runs/x") == ["zero_init_out: False -> True"]
    with pytest.raises(CheckpointError, match="qk_norm: checkpoint False, config True; logit_softcap: checkpoint "
                                              "0.0, config 30.0"):
        check_same_model(MODEL, dict(MODEL, qk_norm=True, logit_softcap=30.0), "runs/x")


@pytest.mark.parametrize("saved_scan", first_fast([True, False]))
def test_resume_converts_the_layer_stack_of_params_and_adam_moments(tmp_path, saved_scan):
    """A checkpoint saved with scan_layers=saved_scan restores into the other layout, the AdamW
    moments included, each array equal to its saved counterpart."""
    from transformer.model.param_tree import stack_layers, unstack_layers

    model = dict(MODEL, num_layers=3, scan_layers=saved_scan)
    cfg = ModelConfig(**model)
    mesh = make_mesh(devices=jax.devices()[:1])
    tx, _ = make_optimizer(OPTIM, 10)
    saved = training.create_state(cfg, tx, 0, mesh).replace(step=jax.numpy.asarray(3, jax.numpy.int32))  # saved at step 3
    mu = jax.tree.map(lambda p: p + 1.0, saved.params)  # distinct values, to see where each goes
    saved = saved.replace(opt_state=(saved.opt_state[0], (saved.opt_state[1][0]._replace(mu=mu),
                                                           *saved.opt_state[1][1:])))
    ckpt = Checkpointer(str(tmp_path))
    ckpt.save(3, saved, {"model": model}, ByteTokenizer(), val_loss=1.0)
    ckpt.wait()

    other = dict(model, scan_layers=not saved_scan)
    fresh = training.create_state(ModelConfig(**other), tx, 1, mesh)
    restored = Checkpointer(str(tmp_path)).restore_state(fresh, other)
    convert = unstack_layers if saved_scan else stack_layers
    jax.tree.map(np.testing.assert_array_equal, restored.params, convert(saved.params, 3))
    jax.tree.map(np.testing.assert_array_equal, restored.opt_state[1][0].mu, convert(mu, 3))
    assert jax.tree.structure(restored) == jax.tree.structure(fresh)
    assert all(a.sharding == b.sharding for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(fresh)))


@pytest.mark.parametrize("saved_scan", first_fast([False, True]))  # the other direction than above
def test_resume_converts_the_layer_stack_of_muon_and_adamw_state(tmp_path, saved_scan):
    """optim.name='muon': Muon's momentum and AdamW's moments (each over its own parameters) move
    to the other layout of the layer stack, each array equal to its saved counterpart."""
    from transformer.model.param_tree import stack_layers, unstack_layers

    model = dict(MODEL, num_layers=3, scan_layers=saved_scan)
    mesh = make_mesh(devices=jax.devices()[:1])
    tx, _ = make_optimizer(dict(OPTIM, name="muon", muon_learning_rate=0.02, muon_momentum=0.95,
                                muon_weight_decay=0.0), 10)
    saved = training.create_state(ModelConfig(**model), tx, 0, mesh).replace(step=jax.numpy.asarray(3, jax.numpy.int32))  # saved at step 3
    distinct = lambda x: np.arange(x.size, dtype=x.dtype).reshape(x.shape) if x.dtype == np.float32 else x  # noqa: E731
    saved = saved.replace(opt_state=jax.tree.map(distinct, saved.opt_state))  # each layer's slice its own values
    ckpt = Checkpointer(str(tmp_path))
    ckpt.save(3, saved, {"model": model}, ByteTokenizer(), val_loss=1.0)
    ckpt.wait()

    other = dict(model, scan_layers=not saved_scan)
    fresh = training.create_state(ModelConfig(**other), tx, 1, mesh)
    restored = Checkpointer(str(tmp_path)).restore_state(fresh, other)
    convert = unstack_layers if saved_scan else stack_layers
    for part in ("muon", "adamw"):
        moments = lambda state: state.opt_state[1].inner_states[part].inner_state[0]  # noqa: E731
        jax.tree.map(np.testing.assert_array_equal, moments(restored).mu, convert(moments(saved).mu, 3))
    assert jax.tree.structure(restored) == jax.tree.structure(fresh)


def test_reading_a_writable_run_does_not_call_it_read_only(tmp_path, caplog):
    """Orbax said 'Given directory is read only' (twice per restore) for any folder opened to read."""
    save_one(tmp_path)
    with caplog.at_level(logging.INFO, logger="absl"):
        restore_for_inference(str(tmp_path))
    assert caplog.records and not [r for r in caplog.records if "read only" in r.getMessage()]
