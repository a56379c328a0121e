"""Sweeps: the variants of a config trained one after another in this process (JAX starts once; a
failing run's error names its variant), then tabulated and plotted. `python sweep.py` calls
`run_sweep`; notebooks `plan` + `run_all`. A sweep file's `get_config()` returns a dict (configs/sweeps/tiny.py):

    base       a config in configs/ by name ("shakespeare"), or a config file's path
    overrides  {dotted field: value} for every run, e.g. {"train.steps": 400}
    variants   {name: {dotted field: value}}, in table order; {} is the base itself
    seeds      optional: each variant trains once per train.seed in the list, in <workdir>/<variant>-seed<s>
(a dict keeps the variants' order). Everything is checked before anything trains; a rerun resumes."""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

import jax
from ml_collections import ConfigDict

from transformer.data.atomic_files import write_atomically
from transformer.experiments.catalog import train
from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder, count_params, example_input
from transformer.model.execution import resolve_auto
from transformer.model.kv_cache import kv_cache_bytes_per_token
from transformer.run.checkpoint import CheckpointError, latest_step
from transformer.run.config_files import flat, load_config, load_config_file, set_fields
from transformer.run.metrics import read_metrics
from transformer.training.loop import Diverged
from transformer.run.checkpoint import saved_form
from transformer.training.setup import DEFAULT_CACHE_DIR, REPO, check_train_config, resolve

CONFIGS = os.path.join(REPO, "configs")

SWEEP_KEYS = ("base", "overrides", "variants", "seeds")
# Fields a run's folder may differ in from the sweep's config: more train.steps continue it; the others change nothing.
MAY_CHANGE = ("train.steps", "train.run_steps", "train.sample_tokens", "train.log_every", "train.eval_every",
              "train.checkpoint_every", "train.keep_checkpoints", "train.peak_flops", "data.cache_dir",
              "train.eval_attention_shares", "train.eval_induction")
FORMAT = ("dict(base='shakespeare', overrides={'train.steps': 300}, variants={'rmsnorm': {'model.norm': "
          "'rmsnorm'}, ...}, seeds=[0, 1]), overrides and seeds optional")


class SweepError(ValueError):
    """The sweep file, or a run folder, cannot give the sweep it describes (exit code 2)."""


@dataclass(frozen=True)
class Job:
    """One training run of the sweep."""

    name: str  # its folder under the sweep's workdir: the variant, with seeds "<variant>-seed<s>"
    changes: dict  # the variant's overrides of the base
    config: ConfigDict  # the run's full config
    workdir: str


def load_sweep(path: str) -> dict:
    """The sweep file's get_config() as a dict, its keys checked."""
    if not os.path.isfile(path):
        raise SweepError(f"--sweep {path!r}: no such file (e.g. configs/sweeps/lecture.py)")
    try:
        sweep = load_config_file(path)
    except Exception as e:  # a syntax error, no get_config, an error inside it
        raise SweepError(f"{path} failed to load ({type(e).__name__}: {e}); get_config() must return "
                         f"{FORMAT}") from None
    if not isinstance(sweep, Mapping | ConfigDict):
        raise SweepError(f"{path}: get_config() returned {type(sweep).__name__}; it must return {FORMAT}")
    sweep = sweep.to_dict() if isinstance(sweep, ConfigDict) else dict(sweep)
    for key in sweep:
        if key not in SWEEP_KEYS:
            close = difflib.get_close_matches(key, SWEEP_KEYS, n=1)
            raise SweepError(f"{path}: unknown key {key!r}" + (f"; did you mean {close[0]!r}?" if close else
                                                               f"; a sweep has {', '.join(SWEEP_KEYS)}"))
    variants, seeds = sweep.get("variants"), sweep.get("seeds") or []
    if not (isinstance(sweep.get("base"), str) and isinstance(variants, Mapping) and variants
            and all(isinstance(v, Mapping | None) for v in variants.values())
            and isinstance(sweep.get("overrides") or {}, Mapping) and isinstance(seeds, list | tuple)
            and all(isinstance(s, int) for s in seeds)):
        raise SweepError(f"{path}: get_config() must return {FORMAT}")
    if len(set(seeds)) < len(seeds):
        raise SweepError(f"{path}: seeds={list(seeds)} repeats a seed, which would train the same run twice; "
                         "list each once")
    return sweep


def base_path(base: str) -> str:
    """A config name ('shakespeare' -> configs/shakespeare.py) or a path to a config file."""
    if base.endswith(".py"):
        return base if os.path.isfile(base) else os.path.join(REPO, base)
    path = os.path.join(CONFIGS, f"{base}.py")
    if not os.path.isfile(path):
        names = [f[:-3] for f in os.listdir(CONFIGS) if f.endswith(".py") and not f.startswith("_")]
        close = difflib.get_close_matches(base, names, n=1)
        raise SweepError(f"sweep base {base!r}: no config {path}" + (f"; did you mean {close[0]!r}?" if close else ""))
    return path


def plan(sweep: dict, sweep_path: str, workdir: str, extra: Mapping | None = None) -> list[Job]:
    """Every run of the sweep (`load_sweep`'s dict), its config built and checked; nothing is trained
    or written. extra: overrides for every run after the sweep's own (e.g. the tests' data.cache_dir)."""
    path = base_path(sweep["base"])
    jobs = []
    for seed in sweep.get("seeds") or [None]:
        for variant, changes in sweep["variants"].items():
            name = variant if seed is None else f"{variant}-seed{seed}"
            if not re.fullmatch(r"[\w.-]+", name):
                raise SweepError(f"variant {variant!r}: name it with letters, digits, '_', '-' or '.' (a folder)")
            try:
                config = load_config(path)  # afresh per run: overrides must not leak from one run to the next
            except ValueError as e:
                raise SweepError(f"sweep base: {e}") from None
            for where, fields in ((f"{sweep_path}: overrides", sweep.get("overrides")),
                                  (f"variant {variant!r}", changes), ("extra overrides", extra),
                                  (f"{sweep_path}: seeds", None if seed is None else {"train.seed": seed})):
                set_fields(config, fields or {}, where, error=SweepError)
            job = Job(name, dict(changes or {}), config, os.path.join(workdir, name))
            try:
                resolved = resolve(config, DEFAULT_CACHE_DIR)
                ModelConfig.from_dict(resolved.model)  # the model's own checks, then the training fields'
                check_train_config(resolved)
            except ValueError as e:
                raise SweepError(f"variant {variant!r}: {e}") from None
            check_run_folder(job)
            jobs.append(job)
    return jobs


def check_run_folder(job: Job) -> None:
    """Raises if the run's folder holds a run of another config, or one past train.steps."""
    saved_path = os.path.join(job.workdir, "config.json")
    if not os.path.isfile(saved_path):
        return
    with open(saved_path) as f:
        saved = flat(json.load(f))
    # As train.py saves it: its 'auto' execution fields chosen for this backend.
    now, _ = saved_form(resolve(job.config, DEFAULT_CACHE_DIR))
    now = flat(json.loads(json.dumps(now)))
    changed = [k for k in now if k in saved and k not in MAY_CHANGE and saved[k] != now[k]]
    if changed:
        what = "; ".join(f"{k}: {saved[k]!r} there, {now[k]!r} now" for k in changed[:4])
        raise SweepError(f"{job.workdir} was trained with another config ({what}); delete that folder to "
                         "train the variant afresh, or give the sweep another --workdir")
    step = latest_step(job.workdir)
    if step is not None and step > job.config.train.steps:
        raise SweepError(f"{job.workdir} is at step {step}, past train.steps={job.config.train.steps}; raise "
                         "train.steps in the sweep, or delete that folder")


def run_all(jobs: list[Job]) -> dict[str, str]:
    """Trains every unfinished run; returns {run name: error} for those that failed. Ctrl-C / SIGTERM
    end the sweep (Interrupted) once the current run has saved."""
    failures = {}
    for i, job in enumerate(jobs, 1):
        steps, step = job.config.train.steps, latest_step(job.workdir)
        if step == steps:
            print(f"[{i}/{len(jobs)}] {job.name}: skipped, finished at step {step} ({job.workdir})", flush=True)
            continue
        changes = ", ".join(f"{k}={v!r}" for k, v in job.changes.items()) or "the base"
        start = f"resuming at step {step} of {steps}" if step else f"{steps} steps"
        print(f"\n[{i}/{len(jobs)}] {job.name} ({changes}): {start} in {job.workdir}", flush=True)
        started = time.perf_counter()
        try:
            train(job.config, job.workdir, progress=False)
        except (ValueError, FileNotFoundError, CheckpointError, Diverged) as e:
            print(f"{job.name} failed: {e}", file=sys.stderr, flush=True)
            failures[job.name] = str(e)
        finally:  # finished or interrupted: this invocation's wall time, set-up and compiling included
            metrics = os.path.join(job.workdir, "metrics.jsonl")
            if job.name not in failures and os.path.isfile(metrics):
                with open(metrics, "a") as f:
                    seconds = time.perf_counter() - started
                    f.write(json.dumps({"step": latest_step(job.workdir) or 0, "wall_seconds": seconds}) + "\n")
    return failures


def run_sweep(sweep_path: str, workdir: str, extra: Mapping | None = None, runner=run_all) -> int:
    """Plans, trains what is left (`runner(jobs)` -> {run name: error}: one after another in this process,
    or sweep.py's side by side), writes results.md and val_loss.png; returns the exit code."""
    sweep = load_sweep(sweep_path)
    jobs = plan(sweep, sweep_path, workdir, extra)
    print(f"sweep {sweep_path}: {len(jobs)} run{'s' * (len(jobs) > 1)} in {workdir}", flush=True)
    failures = runner(jobs)
    results = [collect(job, failures.get(job.name)) for job in jobs]
    title = f"Sweep {sweep_path} (base: {sweep['base']})"
    os.makedirs(workdir, exist_ok=True)
    write_atomically(os.path.join(workdir, "results.md"), table(results, title))
    plot(results, os.path.join(workdir, "val_loss.png"), title)
    print(f"\nwrote {os.path.join(workdir, 'results.md')} and {os.path.join(workdir, 'val_loss.png')}")
    return 1 if failures else 0


# ----------------------------------------------------------------------------- the results


def num_params(cfg: ModelConfig) -> int:
    """The model's parameter count, from shapes alone (jax.eval_shape: nothing is allocated)."""
    shapes = jax.eval_shape(lambda: Decoder(cfg).init(jax.random.key(0), example_input(cfg)))
    return count_params(shapes["params"])


def collect(job: Job, failure: str | None = None) -> dict:
    """One run's results from its folder: metrics.jsonl, config.json, checkpoints."""
    saved = os.path.join(job.workdir, "config.json")
    if os.path.isfile(saved):
        with open(saved) as f:
            cfg = ModelConfig.from_dict(json.load(f)["model"])
    else:  # never started
        cfg = resolve_auto(ModelConfig.from_dict(job.config.model)).cfg  # 'auto': as train.py would choose
    metrics = os.path.join(job.workdir, "metrics.jsonl")
    rows = read_metrics(metrics) if os.path.isfile(metrics) else []
    evals = {r["step"]: r for r in rows if "val_loss" in r}  # a resumed run's repeated steps: the last
    step, steps = latest_step(job.workdir), job.config.train.steps
    status = (f"failed: {failure[:150]}".replace("|", "/") if failure else "done" if step == steps
              else f"at step {step or 0} of {steps}")
    return dict(
        name=job.name, changes=job.changes, params=num_params(cfg), kv_bytes=kv_cache_bytes_per_token(cfg),
        val_loss={s: evals[s]["val_loss"] for s in sorted(evals)},
        final=evals[max(evals)] if evals else None, best=min(evals.values(), key=lambda r: r["val_loss"], default=None),
        tokens_per_sec=statistics.median([r["tokens_per_sec"] for r in rows if "tokens_per_sec" in r] or [math.nan]),
        wall_seconds=sum(r["wall_seconds"] for r in rows if "wall_seconds" in r), status=status,
    )


def table(results: list[dict], title: str) -> str:
    """The results as Markdown: one row per run, parameters relative to the first row."""
    lines = [
        f"# {title}", "",
        "Validation loss in nats per token on the fixed validation batches (final: at the last step; best: "
        "the lowest evaluation); bits per byte at the last step; parameters relative to the first row; "
        "tokens/s the median over the logged windows; wall time of the sweep's train() calls, set-up and "
        "compiling included.", "",
        "| run | changes from the base | parameters | KV cache (bytes/token) | val loss (final) | "
        "val loss (best, step) | bits/byte | tokens/s | wall time | status |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    first = results[0]["params"]
    for r in results:
        changes = ", ".join(f"`{k}={v!r}`" for k, v in r["changes"].items()) or "(the base)"
        params = f"{r['params']:,}" + (f" ({100 * (r['params'] / first - 1):+.1f}%)" if r is not results[0] else "")
        final, best = r["final"], r["best"]
        lines.append(" | ".join([
            f"| {r['name']}", changes, params, f"{r['kv_bytes']:,}",
            f"{final['val_loss']:.4f}" if final else "-",
            f"{best['val_loss']:.4f} ({best['step']})" if best else "-",
            f"{final['val_bits_per_byte']:.3f}" if final else "-",
            f"{r['tokens_per_sec']:,.0f}" if math.isfinite(r["tokens_per_sec"]) else "-",
            duration(r["wall_seconds"]), r["status"] + " |",
        ]))
    return "\n".join(lines) + "\n"


def duration(seconds: float) -> str:
    return "-" if not seconds else f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def plot(results: list[dict], path: str, title: str) -> None:
    """Validation loss against step, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5), dpi=100)
    colors = plt.get_cmap("tab20").colors[::2] + plt.get_cmap("tab20").colors[1::2]  # 10 strong, then pale
    for i, r in enumerate(results):
        ax.plot(list(r["val_loss"]), list(r["val_loss"].values()), "o-", ms=3, lw=1.2, color=colors[i % 20],
                label=r["name"])
    ax.set(xlabel="step", ylabel="validation loss (nats per token)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
