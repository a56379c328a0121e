"""Orbax checkpoints in `workdir/checkpoints`, one folder per step: `state` (arrays), `config`
(`saved_form`) and `tokenizer` (JSON); nothing pickled. A save is renamed into place when complete.
Kept: the latest `keep` and the best by validation loss. A checkpoint restores onto any mesh; a
resume may change execution and initialisation fields (`scan_layers`: the stack is converted)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp

from ml_collections import ConfigDict

from transformer.model.execution import Resolved, resolve_auto
from transformer.model.config import AUTO, ModelConfig
from transformer.model.param_tree import layout_differences, relayout_layers
from transformer.data.tokenizer import Tokenizer, tokenizer_from_json, tokenizer_to_json

CHECKPOINT_DIR = "checkpoints"
KILL_IN_SAVE = "TRANSFORMER_TEST_KILL_IN_SAVE"  # a step: the tests' kill -9 inside that step's (asynchronous) save


def latest_step(workdir: str) -> int | None:
    """The run's latest complete checkpoint step (None before the first), from the folder names alone."""
    directory = os.path.join(workdir, CHECKPOINT_DIR)
    steps = ocp.utils.checkpoint_steps(directory) if os.path.isdir(directory) else []  # finalized ones only
    return max(steps, default=None)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, or from a different model."""


@contextlib.contextmanager
def _without_read_only_note():
    """Drops orbax's 'Given directory is read only' line (logged for any read-only manager, whatever
    the folder's permissions) while a manager opens."""
    logger = logging.getLogger("absl")
    note = lambda record: not record.getMessage().startswith("Given directory is read only")  # noqa: E731
    logger.addFilter(note)
    try:
        yield
    finally:
        logger.removeFilter(note)


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
            ocp.checkpoint_managers.BestN(get_metric_fn=lambda m: m["val_loss"], reverse=True, n=1,
                                          keep_checkpoints_without_metrics=False)])
        options = ocp.CheckpointManagerOptions(
            preservation_policy=policy, create=not read_only, read_only=read_only,
            cleanup_tmp_directories=not read_only, save_interval_steps=0 if read_only else 1)  # 1: the default
        handlers = {"state": ocp.StandardCheckpointHandler(), "config": ocp.JsonCheckpointHandler(),
                    "tokenizer": ocp.JsonCheckpointHandler()}  # named: item_metadata reads shapes, not arrays
        with _without_read_only_note():
            self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, step: int, state: Any, config: Mapping[str, Any], tokenizer: Tokenizer | None,
             val_loss: float) -> None:
        """Writes checkpoint `step` (asynchronously; `wait` blocks until it is on disk)."""
        try:
            self.manager.save(  # waits for the previous save, and raises if that one failed
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state),
                    config=ocp.args.JsonSave(dict(config)),
                    tokenizer=ocp.args.JsonSave(tokenizer_to_json(tokenizer)),
                ),
                metrics={"val_loss": float(val_loss)},
                force=True,
            )
        except Exception as e:  # noqa: BLE001  (orbax's thread errors arrive as any type)
            raise self._save_failed(e) from None
        if os.environ.get(KILL_IN_SAVE) == str(step):  # tests only: a kill -9 while the save is being written
            os.kill(os.getpid(), signal.SIGKILL)

    def wait(self) -> None:
        """Blocks until the saves in flight are on disk; raises CheckpointError if one failed."""
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001
            raise self._save_failed(e) from None

    def _save_failed(self, e: Exception) -> CheckpointError:
        """One line for a save that could not be written (a full disk, a read-only folder)."""
        text = str(e).strip()
        known = _STORAGE_FAULT.search(text)  # orbax's messages name the OS error last, after long paths
        reason = known.group(0) if known else text.splitlines()[0][:300] if text else type(e).__name__
        complete = latest_step(os.path.dirname(self.directory))
        kept = f"the checkpoint of step {complete} is complete" if complete is not None else "no checkpoint is complete yet"
        return CheckpointError(f"a checkpoint could not be written to {self.directory} ({reason}); {kept}. "
                               "Free disk space or make the folder writable, then rerun the same command to resume")

    def close(self) -> None:
        """Waits for the saves in flight and stops orbax's background threads."""
        self.manager.close()

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

    def _unreadable(self, step: int, e: Exception, damaged: bool = False) -> CheckpointError:
        """The error for a checkpoint that failed to read: damaged files (a part missing, or a
        data-loss, decoding or missing-file error) with the way back to the previous checkpoint;
        otherwise the files are not blamed. The first line only: TensorStore's may carry a traceback."""
        first_line = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
        reason = f"{type(e).__name__}: {first_line.split(' See full TensorStore details')[0][:300]}"
        missing = self._missing_parts(step)
        if not (missing or damaged or _is_damage(e)):
            return CheckpointError(
                f"checkpoint step {step} in {self.directory} could not be restored ({reason}). Its files "
                "are not known to be damaged: keep them, and report this error"
            )
        folder = os.path.join(self.directory, str(step))
        earlier = [s for s in self.all_steps() if s < step]
        back = (f"; the same command then uses step {max(earlier)}, the previous complete checkpoint" if earlier
                else "; no earlier checkpoint is left, so start a new --workdir")
        what = f"missing {', '.join(missing[:3])}" if missing else reason
        return CheckpointError(f"checkpoint step {step} in {self.directory} is damaged ({what}): move it aside "
                               f"(mv {folder} {folder}.damaged){back}")

    def _missing_parts(self, step: int) -> list[str]:
        """What a complete save of `step` leaves and is not there (items, metadata, manifest, data),
        relative to the step's folder."""
        folder = os.path.join(self.directory, str(step))
        if not os.path.isdir(folder):
            return []  # nothing on disk to judge by
        parts = ["config/metadata", "tokenizer/metadata", "state/_METADATA", "state/manifest.ocdbt"]
        missing = [p for p in parts if not os.path.isfile(os.path.join(folder, p))]
        state = os.path.join(folder, "state")
        for shard in sorted(os.listdir(state)) if os.path.isdir(state) else []:
            data = os.path.join(state, shard, "d")
            if shard.startswith("ocdbt.process_") and not (os.path.isdir(data) and os.listdir(data)):
                missing.append(f"state/{shard}/d (the arrays' data)")
        return missing

    def config(self, step: int | None = None) -> dict[str, Any]:
        """The resolved run config saved with checkpoint `step` (default: the latest)."""
        step = self._step_or_latest(step)
        return self._restore(step, config=ocp.args.JsonRestore()).config

    def tokenizer(self, step: int | None = None) -> Tokenizer:
        """The tokenizer saved with checkpoint `step` (default: the latest)."""
        step = self._step_or_latest(step)
        saved = self._restore(step, tokenizer=ocp.args.JsonRestore())
        try:
            return tokenizer_from_json(saved.tokenizer)
        except Exception as e:  # a garbled tokenizer/metadata: the tokenizers library raises bare Exceptions
            raise self._unreadable(step, e, damaged=True) from None

    def restore_like(self, state: Any, step: int | None = None) -> Any:
        """The saved state of checkpoint `step` (default the latest) in the structure and shardings of
        `state`, with no model check: a state that is not a decoder's (a sparse autoencoder's)."""
        return self._restore(self._step_or_latest(step), state=ocp.args.StandardRestore(state)).state

    def restore_state(self, state: Any, model_config: Mapping[str, Any], step: int | None = None) -> Any:
        """The train state of checkpoint `step` in the structure and shardings of `state` (a fresh
        one). CheckpointError for another architecture (`check_same_model`) or parameter layout."""
        step = self._step_or_latest(step)
        fields = self.config(step)["model"]
        check_same_model(fields, model_config, self.directory)
        saved = ModelConfig.from_dict(fields)
        # Shapes first, from the metadata: a restore into the wrong shapes fails deep inside orbax.
        check_layout(saved, self.params_metadata(step), self.directory)
        if saved.scan_layers == ModelConfig.from_dict(model_config).scan_layers:
            restored = self.restore_like(state, step)
        else:
            restored = jax.tree.map(lambda x, like: jax.device_put(x, like.sharding),
                                    relayout_layers(self._restore_on_one_device(step), state, saved.num_layers), state)
        if int(restored.step) != step:  # a folder renamed by hand: the step would not match its name
            folder = os.path.join(self.directory, str(step))
            raise CheckpointError(f"{folder} holds the state of step {int(restored.step)}: it was renamed; rename it "
                                  f"back (mv {folder} {os.path.join(self.directory, str(int(restored.step)))})")
        return restored

    def _restore_on_one_device(self, step: int) -> Any:
        """The whole saved state as nested dicts and lists, on this process's first device."""
        try:
            metadata = self.manager.item_metadata(step)["state"]
        except Exception as e:  # orbax raises many types for unreadable files
            raise self._unreadable(step, e) from e
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata.tree)
        return self._restore(step, state=ocp.args.StandardRestore(target)).state

    def params_metadata(self, step: int) -> Any:
        """The saved parameters' shapes and dtypes; no array is read."""
        try:
            return self.manager.item_metadata(step)["state"]["params"]
        except Exception as e:  # orbax raises many types for unreadable files
            raise self._unreadable(step, e) from e

    def restore_params(self, step: int | None = None) -> Any:
        """The parameters of checkpoint `step` (default: the latest), as saved, on one device."""
        return self._restore_on_one_device(self._step_or_latest(step))["params"]


def check_same_model(saved: Mapping[str, Any], current: Mapping[str, Any], where: str) -> list[str]:
    """Raises CheckpointError naming every architecture field that differs; returns the other
    differences (how the parameters start and are computed) as 'name: saved -> now'."""
    saved, current = ModelConfig.from_dict(saved), ModelConfig.from_dict(current)
    diffs = [f"{k}: checkpoint {getattr(saved, k)!r}, config {getattr(current, k)!r}"
             for k in saved.architecture_differences(current)]
    if diffs:
        raise CheckpointError(
            f"the checkpoints in {where} were trained with a different model ("
            + "; ".join(diffs)
            + "). Use a new --workdir for this model, or the config the checkpoint was made with."
        )
    return [f"{k}: {getattr(saved, k)!r} -> {getattr(current, k)!r}" for k in saved.differences(current)]


def check_layout(cfg: ModelConfig, params: Any, where: str) -> None:
    """Raises CheckpointError if the saved parameters are not shaped as this code's Decoder(cfg)."""
    diff = layout_differences(cfg, params)
    if diff:
        raise CheckpointError(
            f"the checkpoint in {where} stores its parameters in another layout than this version of "
            f"the model builds ({'; '.join(diff[:2])}). This version stores every weight matrix "
            "[out, in] (transformer/model/linear.py); checkpoints written in the older [in, out] layout cannot "
            "be loaded by it: train again, or use the version of the code that wrote them"
        )


def restore_for_inference(workdir: str, step: int | None = None) -> tuple[ModelConfig, Any, Tokenizer]:
    """(model config, params, tokenizer) of a run's checkpoint `step` (default: the latest), its
    'auto' fields chosen again for this backend (`saved_model_config`)."""
    if not os.path.isdir(workdir):
        raise FileNotFoundError(f"workdir {workdir!r} {'is a file' if os.path.exists(workdir) else 'does not exist'}; "
                                "pass the --workdir of a training run (e.g. runs/shakespeare after `make train`)")
    ckpt = Checkpointer(workdir, read_only=True)
    step = ckpt._step_or_latest(step)
    cfg = saved_model_config(ckpt.config(step))
    check_layout(cfg, ckpt.params_metadata(step), ckpt.directory)
    return cfg, ckpt.restore_params(step), ckpt.tokenizer(step)


def saved_run(workdir: str) -> dict | None:
    """The config saved with the workdir's latest complete checkpoint, with its "step"; None
    before the first."""
    step = latest_step(workdir)
    if step is None:
        return None
    ckpt = Checkpointer(workdir, read_only=True)
    try:
        return {**ckpt.config(step), "step": step}
    finally:
        ckpt.close()


def saved_form(config: ConfigDict, backend: str | None = None) -> tuple[dict, Resolved]:
    """The config as a run saves it (config.json, every checkpoint) and its model's 'auto' fields
    chosen for `backend` (default: this process's). The saved form holds the choices and
    auto = {"backend": ..., "fields": [...]}, so that a reader on another backend chooses again."""
    resolved = resolve_auto(ModelConfig.from_dict(config.model), backend, seq_len=config.train.seq_len)
    record = config.to_dict()
    record["model"].update({name: getattr(resolved.cfg, name) for name in resolved.auto})
    record["auto"] = {"backend": resolved.backend, "fields": list(resolved.auto)}
    return record, resolved


def saved_model_config(saved: Mapping[str, Any]) -> ModelConfig:
    """The ModelConfig of a saved run config (`saved_form`), its 'auto' fields chosen again for this
    backend: a model trained on a GPU in bfloat16 with cuDNN attention samples on a CPU in float32."""
    cfg = ModelConfig.from_dict(saved["model"])
    chosen = saved.get("auto", {}).get("fields", [])
    return resolve_auto(cfg.replace(**{name: AUTO for name in chosen})).cfg


# The operating system's words for storage that cannot take a write.
_STORAGE_FAULT = re.compile(r"No space left on device|Permission denied|Read-only file system|Disk quota exceeded")
# What orbax and TensorStore say when a checkpoint's files are truncated, garbled or missing.
_DAMAGE = re.compile(r"DATA_LOSS|OUT_OF_RANGE|NOT_FOUND|Error reading|No such file|corrupt", re.IGNORECASE)


def _is_damage(e: BaseException) -> bool:
    """Whether damaged files explain a failed read (not a mismatch on our side)."""
    damaged_types = (json.JSONDecodeError, UnicodeDecodeError, FileNotFoundError, EOFError)
    return isinstance(e, damaged_types) or bool(_DAMAGE.search(str(e)))


def quiet_checkpoint_failures() -> None:
    """Process-wide, once at a command line's start: when a checkpoint cannot be read or written,
    orbax's other reads and writes in flight fail too, each with a traceback that buries the
    one-line CheckpointError. Drops exactly those reports (below)."""
    _ignore_closed_loop_callbacks()
    _ignore_unretrieved_reads()
    _ignore_failed_save_threads()


def _ignore_closed_loop_callbacks() -> None:
    """A failed restore's reads still in flight call into orbax's closed event loop: 'Event loop is
    closed' through sys.unraisablehook."""
    previous = sys.unraisablehook
    if getattr(previous, "ignores_closed_loop", False):
        return

    def hook(unraisable) -> None:
        e = unraisable.exc_value
        if not (isinstance(e, RuntimeError) and str(e) == "Event loop is closed"):
            previous(unraisable)

    hook.ignores_closed_loop = True
    sys.unraisablehook = hook


def _ignore_unretrieved_reads() -> None:
    """A failed restore's other reads of the damaged files: asyncio's 'Task exception was never
    retrieved' at exit."""
    logger = logging.getLogger("asyncio")
    if not any(getattr(f, "ignores_unretrieved", False) for f in logger.filters):
        never_retrieved = lambda record: not record.getMessage().startswith("Task exception was never retrieved")  # noqa: E731
        never_retrieved.ignores_unretrieved = True
        logger.addFilter(never_retrieved)

def _ignore_failed_save_threads() -> None:
    """A failed save: each of orbax's writer and commit threads logs it with a traceback (the next
    save or wait raises it in one line). Drops orbax's records that carry a traceback."""
    logger = logging.getLogger("absl")
    if not any(getattr(f, "ignores_save_threads", False) for f in logger.filters):
        from_orbax_thread = lambda record: not (record.exc_info and f"{os.sep}orbax{os.sep}" in record.pathname)  # noqa: E731
        from_orbax_thread.ignores_save_threads = True
        logger.addFilter(from_orbax_thread)
