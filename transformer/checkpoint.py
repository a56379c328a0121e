"""Orbax checkpoints in `workdir/checkpoints`: train state, resolved config and tokenizer.

Each checkpoint step is a folder with three items: `state` (step, params, optimizer state, PRNG
key, as arrays), `config` (the resolved run config, JSON) and `tokenizer` (JSON). Nothing is
pickled, so restoring a checkpoint runs no code from it. Orbax writes each step into a temporary
folder and renames it when complete, so a run killed mid-save leaves the previous checkpoints
intact; the incomplete folder is ignored and cleaned up at the next start.

Kept: the most recent `keep` checkpoints plus the one with the best validation loss.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp

from transformer.config import ModelConfig
from transformer.tokenizer import Tokenizer, tokenizer_from_json, tokenizer_to_json

CHECKPOINT_DIR = "checkpoints"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, or from a different model."""


class Checkpointer:
    """Saves and restores a run's checkpoints under `workdir/checkpoints`."""

    def __init__(self, workdir: str, keep: int = 3, read_only: bool = False):
        self.directory = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))
        if read_only and not os.path.isdir(self.directory):
            raise CheckpointError(
                f"no checkpoints in {workdir!r} (expected a folder {self.directory}); "
                "train first (python train.py --workdir ...) or pass the workdir of a trained run"
            )
        policy = ocp.checkpoint_managers.AnyPreservationPolicy([
            ocp.checkpoint_managers.LatestN(n=keep),
            ocp.checkpoint_managers.BestN(
                get_metric_fn=lambda m: m["val_loss"], reverse=True, n=1,
                keep_checkpoints_without_metrics=False,
            ),
        ])
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                preservation_policy=policy, create=not read_only, read_only=read_only,
                cleanup_tmp_directories=not read_only,
            ),
            item_handlers={  # named handlers also let item_metadata read shapes without the arrays
                "state": ocp.StandardCheckpointHandler(),
                "config": ocp.JsonCheckpointHandler(),
                "tokenizer": ocp.JsonCheckpointHandler(),
            },
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def best_step(self) -> int | None:
        return self.manager.best_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, step: int, state: Any, config: Mapping[str, Any], tokenizer: Tokenizer,
             val_loss: float) -> None:
        """Writes checkpoint `step` (asynchronously; `wait` blocks until it is on disk)."""
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                config=ocp.args.JsonSave(dict(config)),
                tokenizer=ocp.args.JsonSave(tokenizer_to_json(tokenizer)),
            ),
            metrics={"val_loss": float(val_loss)},
            force=True,
        )

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def _step_or_latest(self, step: int | None) -> int:
        steps = self.all_steps()
        if not steps:
            raise CheckpointError(
                f"the checkpoint folder {self.directory} holds no complete checkpoint; "
                "train first, or pass the workdir of a run that saved one"
            )
        if step is None:
            return max(steps)
        if step not in steps:
            raise CheckpointError(f"no checkpoint at step {step} in {self.directory}; available: {steps}")
        return step

    def _restore(self, step: int, **items: Any) -> Any:
        try:
            return self.manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:  # orbax raises many types for unreadable files
            raise self._unreadable(step, e) from e

    def _unreadable(self, step: int, e: Exception) -> CheckpointError:
        return CheckpointError(
            f"checkpoint step {step} in {self.directory} could not be read ({type(e).__name__}: "
            f"{str(e)[:300]}); it may be corrupted: delete the folder "
            f"{os.path.join(self.directory, str(step))} to fall back to an earlier checkpoint, "
            "or start a new --workdir"
        )

    def config(self, step: int | None = None) -> dict[str, Any]:
        """The resolved run config saved with checkpoint `step` (default: the latest)."""
        step = self._step_or_latest(step)
        return self._restore(step, config=ocp.args.JsonRestore()).config

    def tokenizer(self, step: int | None = None) -> Tokenizer:
        step = self._step_or_latest(step)
        return tokenizer_from_json(self._restore(step, tokenizer=ocp.args.JsonRestore()).tokenizer)

    def restore_state(self, abstract_state: Any, model_config: Mapping[str, Any],
                      step: int | None = None) -> Any:
        """Restores the train state into the structure and shardings of `abstract_state`.

        Raises CheckpointError if the checkpoint was trained with a different model config.
        """
        step = self._step_or_latest(step)
        check_same_model(self.config(step)["model"], model_config, self.directory)
        # Shapes first, from the metadata: a restore into the wrong shapes fails deep inside orbax.
        check_layout(ModelConfig.from_dict(model_config), self.params_metadata(step), self.directory)
        return self._restore(step, state=ocp.args.StandardRestore(abstract_state)).state

    def params_metadata(self, step: int) -> Any:
        """The saved parameters' metadata (shape, dtype per array) of checkpoint `step`; no array is read."""
        try:
            return self.manager.item_metadata(step)["state"]["params"]
        except Exception as e:  # orbax raises many types for unreadable files
            raise self._unreadable(step, e) from e

    def restore_params(self, step: int | None = None) -> Any:
        """Only the parameters of checkpoint `step` (default: the latest), as saved."""
        step = self._step_or_latest(step)
        return self._restore(step, state=ocp.args.StandardRestore()).state["params"]


def check_same_model(saved: Mapping[str, Any], current: Mapping[str, Any], where: str) -> None:
    """Raises CheckpointError naming every model field that differs."""
    saved = ModelConfig.from_dict(saved).to_dict()
    current = ModelConfig.from_dict(current).to_dict()
    diffs = [f"{k}: checkpoint {saved[k]!r}, config {current[k]!r}" for k in saved if saved[k] != current[k]]
    if diffs:
        raise CheckpointError(
            f"the checkpoints in {where} were trained with a different model ("
            + "; ".join(diffs)
            + "). Use a new --workdir for this model, or the config the checkpoint was made with."
        )


def check_layout(cfg: ModelConfig, params: Any, where: str) -> None:
    """Raises CheckpointError if the saved parameters are not shaped as this code's Decoder(cfg)."""
    from transformer.model import layout_differences

    diff = layout_differences(cfg, params)
    if diff:
        raise CheckpointError(
            f"the checkpoint in {where} stores its parameters in another layout than this version of "
            f"the model builds ({'; '.join(diff[:2])}). Since 2026-11-29 every weight matrix is stored "
            "[out, in] (transformer/linear.py); checkpoints written before cannot be loaded by this "
            "version: train again, or use the version of the code that wrote them"
        )


def restore_for_inference(workdir: str, step: int | None = None) -> tuple[ModelConfig, Any, Tokenizer]:
    """(model config, params, tokenizer) of a run's checkpoint `step` (default: the latest).

    workdir: a training run's folder (holding `checkpoints/`).
    """
    if not os.path.isdir(workdir):
        raise FileNotFoundError(
            f"workdir {workdir!r} does not exist; pass the --workdir of a training run "
            "(e.g. runs/shakespeare after `make train`)"
        )
    ckpt = Checkpointer(workdir, read_only=True)
    step = ckpt._step_or_latest(step)
    cfg = ModelConfig.from_dict(ckpt.config(step)["model"])
    params = jax.tree.map(jax.numpy.asarray, ckpt.restore_params(step))
    check_layout(cfg, params, ckpt.directory)
    return cfg, params, ckpt.tokenizer(step)


def save_json(path: str, obj: Any) -> None:
    """Writes JSON atomically (temp file + rename), so a kill never leaves half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
    os.replace(tmp, path)
