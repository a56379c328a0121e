"""What the notebooks share: smoke mode, plots, a small trained model, and the provenance record.

Every notebook's first code cell records what it was executed with (`provenance`): the commit, smoke
mode, the config of every model it builds or loads, with the training fields of a trained one, and a
digest of every transformer module the kernel has loaded by then (`module_digests`).
tests/test_notebooks.py reads the committed notebooks and fails when that record is missing or no
longer matches what the notebook would build today, or names a module whose file has changed since
(`make figures` re-executes them).

The notebooks import the installed project (`make notebooks` installs it editable: transformer,
configs); this file is imported from beside them (Jupyter starts a notebook's kernel in notebooks/).

Environment variables (a relative path is read from the current folder if it exists there, else
from the repository root: Jupyter starts a notebook's kernel in notebooks/, and the README names
paths from the root, so NOTEBOOK_CHECKPOINT=runs/NAME works from either):
  NOTEBOOK_CHECKPOINT   workdir of a trained run (holding checkpoints/) to use instead of training one.
  NOTEBOOK_WORKDIR      where the notebooks' own model is trained (default runs/notebook_model, or a
                        temporary folder in smoke mode).
  NOTEBOOK_FIGURES      folder for the figures the notebooks save (default: figures/ in the run's
                        folder, the one of the two above in use). Only `make figures` sets it, to
                        docs/figures: exploring never rewrites the committed figures.
  NOTEBOOK_RESULTS      folder for the results files of the numbers a docs page quotes (`save_results`;
                        default: beside the figures). Only `make figures` sets it, to docs/experiments.
  NOTEBOOK_DATA         the text a run was trained on (file, folder or glob), when the run's own
                        data.path is not found (a relative data.path is read from the repository root,
                        where train.py runs).
  NOTEBOOK_SMOKE=1      tiny model, few steps (the tests); the default run and its figures go to a
                        temporary folder (in the repository only the git-ignored .cache/tokens is written).
  TRANSFORMER_ROOT      the repository whose runs/ and .cache/ are used (default: the folder
                        above this file); the packages imported are the installed project's.
"""

import contextlib
import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Mapping

import matplotlib.pyplot as plt
from absl import logging as absl_logging

ROOT = os.path.abspath(os.environ.get("TRANSFORMER_ROOT") or os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SMOKE = os.environ.get("NOTEBOOK_SMOKE", "") not in ("", "0")
TOKEN_CACHE = os.path.join(ROOT, ".cache", "tokens")  # git-ignored; train.py uses the same cache

absl_logging.set_verbosity(absl_logging.ERROR)  # orbax's notes on read-only checkpoint folders

plt.rcParams.update({"figure.dpi": 80, "savefig.dpi": 100, "font.size": 10, "axes.titlesize": 10})


def resolve(path: str) -> str:
    """`path` from the current folder if it exists there (or is absolute), else from the repository root."""
    path = os.path.expanduser(path)
    return os.path.abspath(path) if os.path.isabs(path) or os.path.exists(path) else os.path.join(ROOT, path)


@functools.cache
def _smoke_workdir() -> str:
    return tempfile.mkdtemp(prefix="notebook-smoke-")


def run_folder(env: Mapping[str, str] = os.environ, smoke: bool = SMOKE) -> str:
    """The run the notebooks use: NOTEBOOK_CHECKPOINT, else NOTEBOOK_WORKDIR, else runs/notebook_model
    (a temporary folder in smoke mode)."""
    for name in ("NOTEBOOK_CHECKPOINT", "NOTEBOOK_WORKDIR"):
        if env.get(name):
            return resolve(env[name])
    return _smoke_workdir() if smoke else os.path.join(ROOT, "runs", "notebook_model")


def figures_folder(env: Mapping[str, str] = os.environ, smoke: bool = SMOKE) -> str:
    """Where save_figure writes: NOTEBOOK_FIGURES if set, else figures/ in the run's folder."""
    if env.get("NOTEBOOK_FIGURES"):
        return resolve(env["NOTEBOOK_FIGURES"])
    return os.path.join(run_folder(env, smoke), "figures")


def save_figure(fig, name: str, workdir: str | None = None) -> str:
    """Writes `fig` to <folder>/<name>.png and returns the path: NOTEBOOK_FIGURES if set, else
    figures/ in `workdir` if given (retrieval_heads.ipynb's run), else figures_folder()."""
    folder = figures_folder() if workdir is None or os.environ.get("NOTEBOOK_FIGURES") else os.path.join(
        workdir, "figures")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.png")
    fig.savefig(path, bbox_inches="tight", facecolor="white")
    return path


def save_results(page: str, values: Mapping, note: str = "", notebook: str | None = None) -> str:
    """Writes the numbers docs/experiments/<page>.md quotes (`values`), with the command and commit that
    made them, to <page>.json in NOTEBOOK_RESULTS (`make figures`: docs/experiments, where
    tests/test_docs_numbers.py reads them against the page), else beside the figures. Returns the path."""
    folder = resolve(os.environ["NOTEBOOK_RESULTS"]) if os.environ.get("NOTEBOOK_RESULTS") else figures_folder()
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{page}.json")
    notebook = notebook or page
    record = {"command": f"make figures (notebooks/{notebook}.ipynb)",
              "source": f"written by notebooks/{notebook}.ipynb at commit {commit()}" + (f"; {note}" if note else ""),
              **values}
    with open(path + ".tmp", "w") as f:
        f.write(json.dumps(record, indent=1, default=lambda x: x.item()) + "\n")  # NumPy scalars as numbers
    os.replace(path + ".tmp", path)  # whole or not at all
    return path


def train_config(smoke: bool = SMOKE):
    """The notebooks' model: configs/shakespeare.py made smaller and shorter (tiny.py in smoke mode)."""
    if smoke:
        from configs import tiny

        c = tiny.get_config()
        c.train.steps = 10
    else:
        from configs import shakespeare

        c = shakespeare.get_config()
        c.model.d_model = 128  # 4 layers x 4 heads of width 32
        c.model.num_heads = 4
        c.train.steps = 500  # ~2 minutes on 2 CPU cores
        c.train.batch_size = 16
        c.train.eval_every = 250
        c.train.checkpoint_every = 500
        c.train.eval_batches = 4
        c.optim.learning_rate = 3e-3
        c.optim.warmup_steps = 50
    c.train.sample_tokens = 0
    c.data.cache_dir = TOKEN_CACHE
    return c


def recall_config(smoke: bool = SMOKE):
    """retrieval_heads.ipynb's model: configs/recall.py as it is (the README's run), or a tiny one
    trained for a few steps in smoke mode."""
    from configs import recall

    c = recall.get_config()
    if smoke:
        c.model.update(dict(d_model=32, num_layers=2, num_heads=2, head_dim=16, num_kv_heads=2, mlp_dim=64,
                            max_seq_len=256))
        c.data.needle.update(dict(facts=2, min_length=96, max_length=112))
        # seq_len: the longest prompt (112), its answer (3) and the recipe's 2 more questions (2 x 25), less 1
        c.train.update(dict(steps=10, batch_size=4, seq_len=164, eval_every=10, eval_batches=1, checkpoint_every=10))
        c.optim.warmup_steps = 2
    c.data.cache_dir = TOKEN_CACHE
    return c


RECALL_MODEL = "configs/recall.py"  # model.from for retrieval_heads.ipynb's model
# The needle task's fields, recorded for retrieval_heads.ipynb's model besides RUN_FIELDS.
NEEDLE_FIELDS = ("data.task", "data.needle.facts", "data.needle.question", "data.needle.min_length",
                 "data.needle.max_length", "data.needle.min_depth", "data.needle.max_depth", "data.needle.digits",
                 "data.needle.graded", "data.needle.questions")


@functools.cache
def _smoke_recall_workdir() -> str:
    return tempfile.mkdtemp(prefix="notebook-smoke-recall-")


def recall_run_folder(env: Mapping[str, str] = os.environ, smoke: bool = SMOKE) -> str:
    """retrieval_heads.ipynb's run: NOTEBOOK_RECALL_WORKDIR, else runs/recall (what the README's command
    trains; a temporary folder in smoke mode)."""
    if env.get("NOTEBOOK_RECALL_WORKDIR"):
        return resolve(env["NOTEBOOK_RECALL_WORKDIR"])
    return _smoke_recall_workdir() if smoke else os.path.join(ROOT, "runs", "recall")


def load_recall_model():
    """(cfg, params, tokenizer, workdir) of retrieval_heads.ipynb's model: the finished run of
    recall_config() in recall_run_folder(), trained there first if it holds none (a stopped run resumes)."""
    workdir = recall_run_folder()
    cfg, params, tokenizer, _ = _finished_run(recall_config(), workdir, "_setup.recall_config()", NEEDLE_FIELDS,
                                              RECALL_MODEL)
    return cfg, params, tokenizer, workdir


def _finished_run(config, workdir: str, builder: str, task_fields: tuple[str, ...], source: str):
    """(cfg, params, tokenizer, the run's saved config) of the finished run of `config` in `workdir`,
    trained there first if it holds none (a stopped run resumes), else checked to be that run
    (RUN_FIELDS + task_fields, `builder` named in the error); its provenance is printed."""
    from transformer.run.checkpoint import Checkpointer, latest_step, restore_for_inference

    done = os.path.isdir(os.path.join(workdir, "checkpoints")) and (
        latest_step(workdir) or 0) >= config.train.steps
    if done:
        _check_same_run(config, workdir, builder, RUN_FIELDS + task_fields)
    else:
        _train(config, workdir)
    cfg, params, tokenizer = restore_for_inference(workdir)
    ckpt = Checkpointer(workdir, read_only=True)
    provenance({"model": cfg}, run_fields(ckpt.config(), RUN_FIELDS + task_fields), model={
        "run": _name(workdir), "from": source, "step": latest_step(workdir), "val_loss": _val_loss(workdir)})
    return cfg, params, tokenizer, ckpt.config()


TABLES_MODEL = "configs/tables.py"  # model.from for tables.ipynb's model
# The table task's fields, recorded for tables.ipynb's model besides RUN_FIELDS.
TABLES_FIELDS = ("data.task", "data.tables.max_features", "data.tables.max_classes", "data.tables.min_train_rows",
                 "data.tables.min_test_rows", "data.tables.mlp_share", "data.tables.min_separation",
                 "data.tables.max_separation")


def tables_config(smoke: bool = SMOKE):
    """tables.ipynb's model: configs/tables.py as it is (docs/experiments/tables.md's run), or a tiny
    one trained for a few steps in smoke mode."""
    from configs import tables

    c = tables.get_config()
    if smoke:
        c.model.update(dict(d_model=32, num_layers=2, num_heads=2, mlp_dim=64))
        c.train.update(dict(steps=10, batch_size=4, seq_len=32, eval_every=10, eval_batches=1, checkpoint_every=10))
        c.optim.warmup_steps = 2
    return c


@functools.cache
def _smoke_tables_workdir() -> str:
    return tempfile.mkdtemp(prefix="notebook-smoke-tables-")


def tables_run_folder(env: Mapping[str, str] = os.environ, smoke: bool = SMOKE) -> str:
    """tables.ipynb's run: NOTEBOOK_TABLES_WORKDIR, else runs/tables (what the command of
    docs/experiments/tables.md trains; a temporary folder in smoke mode)."""
    if env.get("NOTEBOOK_TABLES_WORKDIR"):
        return resolve(env["NOTEBOOK_TABLES_WORKDIR"])
    return _smoke_tables_workdir() if smoke else os.path.join(ROOT, "runs", "tables")


def load_tables_model():
    """(cfg, params, run config, workdir) of tables.ipynb's model: the finished run of tables_config()
    in tables_run_folder(), trained there first if it holds none (a stopped run resumes)."""
    workdir = tables_run_folder()
    cfg, params, _, saved = _finished_run(tables_config(), workdir, "_setup.tables_config()", TABLES_FIELDS,
                                          TABLES_MODEL)
    return cfg, params, saved, workdir


def proteins_config(smoke: bool = SMOKE):
    """proteins.ipynb's model: configs/proteins.py as it is (seed 0 of docs/experiments/proteins.md's
    command), or a tiny one on tiny families trained for a few steps in smoke mode."""
    from configs import proteins

    c = proteins.get_config()
    if smoke:
        c.data.proteins.update(dict(families=3, train_families=2, min_length=16, max_length=20, sequences=300,
                                    held_out=30, sweeps=5))
        c.model.update(dict(d_model=16, num_layers=1, num_heads=2, mlp_dim=32, max_seq_len=20))
        c.train.update(dict(steps=10, batch_size=4, seq_len=20, eval_every=10, eval_batches=1, checkpoint_every=10))
        c.optim.warmup_steps = 2
    return c


PROTEINS_MODEL = "configs/proteins.py"  # model.from for proteins.ipynb's model
# The protein task's fields, recorded for proteins.ipynb's model besides RUN_FIELDS.
PROTEINS_FIELDS = ("data.task", *(f"data.proteins.{k}" for k in (
    "families", "train_families", "min_length", "max_length", "sequences", "held_out", "sweeps", "coupling",
    "field", "seed")))


@functools.cache
def _smoke_proteins_workdir() -> str:
    return tempfile.mkdtemp(prefix="notebook-smoke-proteins-")


def load_proteins_model():
    """(cfg, params, run config, workdir) of proteins.ipynb's model: NOTEBOOK_PROTEINS_WORKDIR, else
    runs/proteins/seed_0 (what scripts/protein_experiment.py --workdir runs/proteins trains; a temporary
    folder in smoke mode), trained there first if it holds no finished run of proteins_config()."""
    workdir = (resolve(os.environ["NOTEBOOK_PROTEINS_WORKDIR"]) if os.environ.get("NOTEBOOK_PROTEINS_WORKDIR")
               else _smoke_proteins_workdir() if SMOKE else os.path.join(ROOT, "runs", "proteins", "seed_0"))
    cfg, params, _, saved = _finished_run(proteins_config(), workdir, "_setup.proteins_config()", PROTEINS_FIELDS,
                                          PROTEINS_MODEL)
    return cfg, params, saved, workdir


def load_model():
    """(cfg, params, tokenizer, workdir): NOTEBOOK_CHECKPOINT's model, else the notebooks' own one,
    trained first if its workdir holds no finished run (a stopped run resumes)."""
    from transformer.run.checkpoint import Checkpointer, latest_step, restore_for_inference

    workdir = run_folder()
    if os.environ.get("NOTEBOOK_CHECKPOINT"):
        if not os.path.isdir(workdir):
            raise FileNotFoundError(
                f"NOTEBOOK_CHECKPOINT={os.environ['NOTEBOOK_CHECKPOINT']!r} is not a folder, neither from "
                f"{os.getcwd()} nor from the repository root {ROOT}. Set it to the --workdir of a trained "
                "run (e.g. runs/shakespeare after `make train`), or unset it to train the notebooks' own model.")
    else:
        config = train_config()
        done = os.path.isdir(os.path.join(workdir, "checkpoints")) and (
            latest_step(workdir) or 0) >= config.train.steps
        if done:
            _check_same_run(config, workdir)
        else:
            _train(config, workdir)
    cfg, params, tokenizer = restore_for_inference(workdir)
    ckpt = Checkpointer(workdir, read_only=True)
    source = "NOTEBOOK_CHECKPOINT" if os.environ.get("NOTEBOOK_CHECKPOINT") else OWN_MODEL
    provenance({"model": cfg}, run_fields(ckpt.config()), model={
        "run": _name(workdir), "from": source, "step": latest_step(workdir), "val_loss": _val_loss(workdir)})
    return cfg, params, tokenizer, workdir


def _check_same_run(config, workdir: str, builder: str = "_setup.train_config()", fields=None) -> None:
    """Raises if the finished run in `workdir` was trained with another model or run config (its
    `fields`, default RUN_FIELDS) than `config`, which `builder` made (e.g. runs/notebook_model left over
    from an older train_config())."""
    from transformer.run.checkpoint import Checkpointer, saved_model_config
    from transformer.run.checkpoint import saved_form

    saved = Checkpointer(workdir, read_only=True).config()
    # Both with their 'auto' execution fields chosen for this backend, as load_model's model is.
    now, then = saved_form(config)[1].cfg, saved_model_config(saved)
    differences = [f"model.{k}: {then.to_dict()[k]!r} -> {now.to_dict()[k]!r}" for k in then.differences(now)]
    wanted, found = run_fields(config, fields or RUN_FIELDS), run_fields(saved, fields or RUN_FIELDS)
    differences += [f"{k}: {found.get(k)!r} -> {wanted[k]!r}" for k in wanted if found.get(k) != wanted[k]]
    if differences:
        raise ValueError(
            f"{workdir} holds a model trained with another config than {builder} builds now "
            f"({'; '.join(differences)}). Delete that folder (rm -rf {_name(workdir)}) and run the cell again "
            "to train today's model.")


# --- Provenance: what a notebook was executed with -------------------------------------------------

PROVENANCE_MIME = "application/vnd.transformer.provenance+json"
OWN_MODEL = "_setup.train_config()"  # model.from for the notebooks' own model
# The training fields recorded for a trained model (besides its ModelConfig): what it learned from.
RUN_FIELDS = ("train.steps", "train.batch_size", "train.seq_len", "train.seed", "optim.learning_rate",
              "optim.warmup_steps", "data.path", "data.tokenizer", "data.val_fraction")
# What decides the notebooks' outputs besides each notebook's own cells: uncommitted changes to these
# tracked files mark the commit "+dirty". The notebooks themselves are left out: `make figures`
# rewrites them one after another, and a notebook's own cells are what its kernel ran.
CODE_PATHS = ("transformer", "configs", "train.py", "notebooks", ":(exclude)notebooks/*.ipynb")


def commit(root: str = ROOT) -> str:
    """`git rev-parse --short HEAD` of `root`, plus '+dirty' if tracked files under CODE_PATHS have
    uncommitted changes; 'unknown' outside a git checkout."""
    def git(*args):
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=30)

    try:
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode:
            return "unknown"
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty else "")


def run_fields(config, names: tuple[str, ...] = RUN_FIELDS) -> dict:
    """The fields `names` (default RUN_FIELDS) of a run config (a ConfigDict or a checkpoint's saved
    config), as 'section.field': value; a data.path under the repository is written relative to it
    (train.py saves it absolute). A field the config lacks (a run saved before it existed) is None."""
    fields = {name: functools.reduce(lambda c, k: c.get(k) if c is not None else None, name.split("."), config)
              for name in names}
    path = fields["data.path"]
    if path and os.path.isabs(path) and path.startswith(ROOT + os.sep):
        fields["data.path"] = os.path.relpath(path, ROOT)
    return fields


def provenance(configs: Mapping, run: Mapping | None = None, model: Mapping | None = None) -> dict:
    """Records, as this cell's output, what the notebook is executed with: the commit, smoke mode,
    the ModelConfig of every model it builds (`configs`, name -> ModelConfig) and, for a trained one,
    where it came from (`model`: run, from, step, val_loss) and its RUN_FIELDS (`run`). Shown as text;
    the same record, every field of every config, is stored as JSON (PROVENANCE_MIME) for
    tests/test_notebooks.py. Returns it."""
    record = {"commit": commit(), "smoke": SMOKE, "model": dict(model) if model else None,
              "configs": {name: cfg.to_dict() for name, cfg in configs.items()},
              "run": dict(run) if run is not None else None, "modules": module_digests()}
    record = json.loads(json.dumps(record))  # exactly what the notebook file will hold

    lines = [f"provenance: executed at commit {record['commit']}, NOTEBOOK_SMOKE {'on' if SMOKE else 'off'}"]
    if model:
        loss = f", validation loss {model['val_loss']:.3f} nats/token" if model.get("val_loss") is not None else ""
        lines.append(f"model: {model['run']}, step {model['step']}{loss} (from {model['from']})")
    for name, cfg in configs.items():  # the text names the fields that differ from their defaults
        changed = [f.name for f in cfg.fields() if getattr(cfg, f.name) != f.default]
        text = ", ".join(f"{k}={getattr(cfg, k)!r}" for k in changed)
        lines.append(textwrap.fill(text, 110, initial_indent=f"{name}: ModelConfig(", subsequent_indent="    ") + ")")
    if run is not None:
        lines.append(textwrap.fill(", ".join(f"{k}={v!r}" for k, v in record["run"].items()), 110,
                                   initial_indent="run: ", subsequent_indent="    "))
    from IPython.display import display

    display({PROVENANCE_MIME: record, "text/plain": "\n".join(lines)}, raw=True)
    return record


def module_digests() -> dict[str, str]:
    """{module name: the first 16 hex digits of its file's sha256} for every module of the transformer
    package this kernel has loaded: what decides the outputs besides the configs."""
    digests = {}
    for name, module in sorted(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if (name == "transformer" or name.startswith("transformer.")) and path and os.path.isfile(path):
            digests[name] = file_digest(path)
    return digests


def file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def _name(workdir: str) -> str:
    """`workdir` relative to the repository root if it lies under it (runs/notebook_model)."""
    return os.path.relpath(workdir, ROOT) if os.path.abspath(workdir).startswith(ROOT + os.sep) else workdir


def _val_loss(workdir: str) -> float | None:
    """The run's last validation loss in metrics.jsonl (None if it has none)."""
    from transformer.run.metrics import read_metrics

    metrics = os.path.join(workdir, "metrics.jsonl")
    losses = [r["val_loss"] for r in read_metrics(metrics) if "val_loss" in r] if os.path.exists(metrics) else []
    return round(float(losses[-1]), 4) if losses else None


def _train(config, workdir: str) -> None:
    from transformer.experiments.catalog import train

    os.makedirs(workdir, exist_ok=True)
    log = os.path.join(workdir, "train.log")
    print(f"training {config.train.steps} steps into {workdir} (progress in train.log there) ...", flush=True)
    with open(log, "a") as f, contextlib.redirect_stdout(f):  # the evaluation lines and sample
        metrics = train(config, workdir, progress=False)
    bits = f" ({metrics['val_bits_per_byte']:.2f} bits/byte)" if "val_bits_per_byte" in metrics else ""  # text only
    print(f"done: validation loss {metrics['val_loss']:.3f} nats/token{bits} after {metrics['step']} steps")


def data_path(workdir: str) -> str | None:
    """The text the run in `workdir` was trained on: NOTEBOOK_DATA if set, else the run's data.path
    (a relative one from the repository root); None for the bundled plays. Raises FileNotFoundError
    naming the path and the fix if no text is there."""
    from transformer.run.checkpoint import Checkpointer
    from transformer.data.corpus import corpus_files

    if os.environ.get("NOTEBOOK_DATA"):
        given, path = f"NOTEBOOK_DATA={os.environ['NOTEBOOK_DATA']!r}", resolve(os.environ["NOTEBOOK_DATA"])
    else:
        saved = Checkpointer(workdir, read_only=True).config()["data"]["path"]
        if not saved:
            return None
        given, path = f"the run's data.path {saved!r}", os.path.join(ROOT, os.path.expanduser(saved))
    try:
        corpus_files(path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{given}: no text at {path} (run {workdir}). Set NOTEBOOK_DATA to the file, folder or glob the "
            "run was trained on (in the shell that starts Jupyter, or `%env NOTEBOOK_DATA=...` in the "
            "notebook) and run the cell again.") from None
    return path


def validation_tokens(workdir: str, tokenizer):
    """The validation split of the corpus the run in `workdir` was trained on (1-D token array),
    from the run's token cache if its data.cache_dir is still there, else from .cache/tokens."""
    from transformer.run.checkpoint import Checkpointer
    from transformer.data.corpus import load_corpus

    saved = Checkpointer(workdir, read_only=True).config()["data"]
    cache = os.path.join(ROOT, os.path.expanduser(saved["cache_dir"]))
    cache = cache if os.path.isdir(cache) else TOKEN_CACHE
    return load_corpus(data_path(workdir), tokenizer, cache, saved["val_fraction"]).val


# --- The models of the model-free notebooks (built here so that the test can rebuild them) ---------


def lecture_layer_config():
    """attention_basics.ipynb's one attention layer: the lecture's d = 6, H = 2 heads of width 3,
    n = 5 tokens, no biases."""
    from transformer.model.config import ModelConfig

    return ModelConfig(vocab_size=8, max_seq_len=5, d_model=6, num_layers=1, num_heads=2, use_bias=False)


def kv_cache_variants(smoke: bool = SMOKE) -> dict:
    """kv_cache.ipynb's models, name -> ModelConfig: configs/llama.py with H, H/4 and 1 key/value
    heads (MHA, GQA, MQA) and configs/mla.py (MLA); in smoke mode 2 layers of width 64."""
    from configs import llama, mla
    from transformer.model.execution import resolve_auto
    from transformer.model.config import ModelConfig

    gqa_fields = llama.get_config().model.to_dict()
    mla_fields = mla.get_config().model.to_dict()
    if smoke:
        small = dict(d_model=64, num_layers=2, num_heads=4, mlp_dim=128, max_seq_len=64)
        gqa_fields.update(small)
        mla_fields.update(small, head_dim=16, v_head_dim=16, kv_latent_dim=16, rope_head_dim=8, q_latent_dim=24)
    heads = gqa_fields["num_heads"]
    fields = {
        "MHA": {**gqa_fields, "num_kv_heads": heads},
        "GQA": {**gqa_fields, "num_kv_heads": heads // 4 if heads >= 8 else heads // 2},
        "MQA": {**gqa_fields, "num_kv_heads": 1},
        "MLA": mla_fields,
    }
    # The configs' 'auto' dtype and attention, chosen for this backend (float32 on a CPU).
    return {name: resolve_auto(ModelConfig.from_dict(f)).cfg for name, f in fields.items()}


# --- attention_sinks.ipynb: the sink experiment's runs (built here so that the test can rebuild them) ---

SINKS_SWEEP = os.path.join(ROOT, "configs", "sweeps", "sinks.py")
# Smoke mode: the sweep's four variants on a one-layer model (each compiles its own programs), a few steps.
SINKS_SMOKE = {"model.d_model": 32, "model.num_layers": 1, "model.max_seq_len": 32, "train.seq_len": 32,
               "train.batch_size": 4, "train.steps": 6, "train.log_every": 3, "train.eval_every": 3,
               "train.checkpoint_every": 6, "optim.warmup_steps": 2}


def sinks_runs(smoke: bool = SMOKE) -> tuple[list, str]:
    """(the runs of configs/sweeps/sinks.py as sweep.Job: name, config, workdir; the sweep's folder):
    runs/sweeps/sinks, as `make sweep SWEEP=configs/sweeps/sinks.py` trains them; in smoke mode a
    tiny model (SINKS_SMOKE) in a temporary folder. Nothing is trained here."""
    from transformer.experiments import sweep

    workdir = os.path.join(_smoke_workdir(), "sinks") if smoke else os.path.join(ROOT, "runs", "sweeps", "sinks")
    extra = {**SINKS_SMOKE, "data.cache_dir": TOKEN_CACHE} if smoke else {}
    return sweep.plan(sweep.load_sweep(SINKS_SWEEP), SINKS_SWEEP, workdir, extra), workdir


def sinks_configs(smoke: bool = SMOKE) -> tuple[dict, dict]:
    """({run name: ModelConfig}, the runs' RUN_FIELDS) of attention_sinks.ipynb's runs."""
    from transformer.model.execution import resolve_auto
    from transformer.model.config import ModelConfig

    jobs, _ = sinks_runs(smoke)
    # The configs' 'auto' dtype, chosen for this backend (float32 on a CPU).
    return ({job.name: resolve_auto(ModelConfig.from_dict(job.config.model)).cfg for job in jobs},
            run_fields(jobs[0].config))


# --- looking_inside.ipynb: configs/modern_b32.py (the default until 2026-12-05), and the same longer ---

LOOKING_LONG_STEPS = 2000  # ~15 minutes on 2 CPU cores: five times configs/modern_b32.py's 400 steps
COPYING_STEPS = 1500  # the copying run: 2 layers, ~6 minutes on 2 CPU cores


def looking_configs(smoke: bool = SMOKE) -> dict:
    """looking_inside.ipynb's three runs, name -> run config: 'default', configs/modern_b32.py (the
    default recipe as `make train` trained it until 2026-12-05, 400 steps of 32; it now trains 560 of
    16, which ends no differently); 'long', the same config for LOOKING_LONG_STEPS steps; and
    'copying', the same recipe with 2 layers for COPYING_STEPS steps on the copying corpus
    (transformer/experiments/copying/copying.py, written to looking_folder()/copying.txt by `load_looking_models`),
    where only induction predicts the repeats. All evaluate every 50 steps (make train: every 100;
    the model is the same) with the induction metric on (train.eval_induction: each head's induction
    score and the repeated-tokens losses, logged). In smoke mode configs/tiny.py for 10, 20 and 20 steps."""
    from configs import modern_b32, tiny

    runs = {}
    for name in ("default", "long", "copying"):
        c = tiny.get_config() if smoke else modern_b32.get_config()
        if smoke:
            c.train.update(dict(steps=10 if name == "default" else 20, eval_every=5, checkpoint_every=10))
        else:
            c.train.steps = {"default": 400, "long": LOOKING_LONG_STEPS, "copying": COPYING_STEPS}[name]
            c.train.eval_every = 50
        if name == "copying":
            c.model.num_layers = 2
            c.data.path = copying_corpus_path(smoke)
        c.train.eval_induction = True
        c.train.sample_tokens = 0
        c.data.cache_dir = TOKEN_CACHE
        runs[name] = c
    return runs


def copying_corpus_path(smoke: bool = SMOKE) -> str:
    """Where the 'copying' run's corpus lies: copying.txt in looking_folder()."""
    return os.path.join(looking_folder(smoke=smoke), "copying.txt")


def looking_folder(env: Mapping[str, str] = os.environ, smoke: bool = SMOKE) -> str:
    """Where looking_inside.ipynb trains its runs (one folder each): NOTEBOOK_LOOKING_WORKDIR, else
    runs/looking_inside (a temporary folder in smoke mode)."""
    if env.get("NOTEBOOK_LOOKING_WORKDIR"):
        return resolve(env["NOTEBOOK_LOOKING_WORKDIR"])
    return os.path.join(_smoke_workdir(), "looking_inside") if smoke else os.path.join(ROOT, "runs", "looking_inside")


def load_looking_models() -> dict:
    """{name: (cfg, params, tokenizer, workdir)} of looking_inside.ipynb's runs (`looking_configs`),
    each trained first if its folder holds no finished run (a stopped run resumes), the copying
    corpus written first; records the provenance of all three."""
    from transformer.experiments.copying.copying import write_copying_corpus
    from transformer.run.checkpoint import restore_for_inference

    write_copying_corpus(copying_corpus_path(), num_bytes=20_000 if SMOKE else 2_000_000)
    runs = {name: (config, os.path.join(looking_folder(), name)) for name, config in looking_configs().items()}
    return _trained_runs(runs, looking_folder(), "_setup.looking_configs()",
                         lambda workdir: (*restore_for_inference(workdir), workdir))


def _trained_runs(runs: Mapping, folder: str, builder: str, load) -> dict:
    """{name: load(workdir)} of runs {name: (config, workdir)}, each trained first if its folder holds
    no finished run (a stopped run resumes) or checked to be that config's; records their provenance
    (`builder`: the function that made the configs, named in a mismatch's error)."""
    from transformer.run.checkpoint import Checkpointer, latest_step

    models, configs, fields, sources = {}, {}, {}, {}
    for name, (config, workdir) in runs.items():
        done = os.path.isdir(os.path.join(workdir, "checkpoints")) and (
            latest_step(workdir) or 0) >= config.train.steps
        if done:
            _check_same_run(config, workdir, builder)
        else:
            _train(config, workdir)
        models[name] = load(workdir)
        ckpt = Checkpointer(workdir, read_only=True)
        configs[name], fields[name] = models[name][0], run_fields(ckpt.config())
        sources[name] = {"run": _name(workdir), "step": latest_step(workdir), "val_loss": _val_loss(workdir)}
    provenance(configs, fields, model={"run": _name(folder), "from": builder,
                                       "step": {k: v["step"] for k, v in sources.items()},
                                       "val_loss": None, "runs": sources})
    return models


# --- vision.ipynb: the ViT runs of docs/experiments/vision.md (seed 0 of each) ---------------------------

VISION_RUNS = {"shapes": ("vit", 0), "shapes_registers": ("vit", 4), "digits": ("vit_digits", 0),  # config, registers
               "vqa": ("vqa", 0)}  # image question answering: scripts/vqa_experiment.py trains it into runs/vqa/seed0


def vision_configs(smoke: bool = SMOKE) -> dict:
    """vision.ipynb's runs, name -> run config: configs/vit.py (0 and 4 registers), configs/vit_digits.py and
    configs/vqa.py, seed 0, as scripts/vision_experiment.py and scripts/vqa_experiment.py train them; in smoke
    mode a tiny ViT (and the question-answering model) for 10 steps."""
    import importlib

    runs = {}
    for name, (module, registers) in VISION_RUNS.items():
        c = importlib.import_module(f"configs.{module}").get_config()
        c.model.num_registers = registers
        if smoke and name != "vqa":  # the question-answering model is small already: fewer steps only
            c.model.update(dict(d_model=16, num_layers=2, num_heads=2, mlp_dim=32))
        if smoke:
            c.train.update(dict(steps=10, batch_size=8, eval_every=10, eval_batches=1, checkpoint_every=10))
            c.optim.warmup_steps = 2
        runs[name] = c
    return runs


def vision_folder(env: Mapping[str, str] = os.environ, smoke: bool = SMOKE) -> str:
    """Where vision.ipynb finds its runs (NAME_seed0 each): NOTEBOOK_VISION_WORKDIR, else runs/vision (what
    scripts/vision_experiment.py trains; a temporary folder in smoke mode)."""
    if env.get("NOTEBOOK_VISION_WORKDIR"):
        return resolve(env["NOTEBOOK_VISION_WORKDIR"])
    return os.path.join(_smoke_workdir(), "vision") if smoke else os.path.join(ROOT, "runs", "vision")


def load_vision_models() -> dict:
    """{name: (cfg, params, workdir)} of vision.ipynb's runs (`vision_configs`), each trained first if its
    folder holds no finished run; records the provenance of all of them."""
    from transformer.run.checkpoint import restore_for_inference

    runs = {}
    for name, config in vision_configs().items():
        workdir = os.path.join(vision_folder(), f"{name}_seed0")
        if name == "vqa" and workdir == os.path.join(ROOT, "runs", "vision", "vqa_seed0"):
            workdir = os.path.join(ROOT, "runs", "vqa", "seed0")  # where scripts/vqa_experiment.py trains it
        runs[name] = (config, workdir)
    return _trained_runs(runs, vision_folder(), "_setup.vision_configs()",
                         lambda workdir: (*restore_for_inference(workdir)[:2], workdir))
