"""The committed notebooks were executed by today's code; the notebooks run top to bottom in smoke mode
and leave the repository as it was; `make plot` and `make figures` write where they should.

The committed notebooks are read, not executed (fast): each must hold no error, and its provenance
record (the first cell's output, see notebooks/_setup.py) must match what the notebook builds now.

Each notebook executes in memory from a temporary copy of notebooks/ (its kernel starts there, as
under Jupyter): the committed notebooks, their outputs and docs/ are not touched. Every notebook runs
on a run of the user's own, named by a relative NOTEBOOK_CHECKPOINT as the README writes it: MLA
attention, a BPE tokenizer and a relative data.path, trained by train.py under runs/ (git-ignored)
and removed afterwards. The notebooks that load a model also run on their own tiny model, trained
into a temporary folder by the first of them. The kernel is this test's own Python interpreter, whatever kernels are
installed elsewhere.
"""

import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import nbclient
import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = ["attention_basics", "attention_maps", "attention_sinks", "head_ablation", "kv_cache", "looking_inside",
             "retrieval_heads", "tables", "features", "vision", "proteins"]
OWN_MODELS = ("looking_inside", "retrieval_heads", "tables", "vision", "proteins")  # they train models of their own tasks or lengths: no user's run
KERNEL = "transformer-notebook-test"
import _setup  # noqa: E402  (the notebooks' shared set-up; notebooks/ is on pytest's pythonpath)
from scripts import plot_metrics  # noqa: E402
from transformer.model.execution import resolve_auto  # noqa: E402
from transformer.model.config import ModelConfig  # noqa: E402


def uses_a_model(name):
    with open(os.path.join(ROOT, "notebooks", f"{name}.ipynb")) as f:
        return "_setup.load_model()" in f.read()


def test_every_notebook_is_tested():
    found = sorted(f[: -len(".ipynb")] for f in os.listdir(os.path.join(ROOT, "notebooks")) if f.endswith(".ipynb"))
    assert found == sorted(NOTEBOOKS)


# --- The committed notebooks: outputs from today's code (read, not executed) --------------------

FIX = ("Re-execute the notebooks with today's code: `make figures` (it trains runs/notebook_model first if "
       "it is missing), or without redrawing docs/loss_curve.png: NOTEBOOK_FIGURES=$PWD/docs/figures "
       "NOTEBOOK_RESULTS=$PWD/docs/experiments "
       "JUPYTER_PATH=$PWD/.venv/share/jupyter .venv/bin/jupyter nbconvert --to notebook --execute --inplace "
       "notebooks/*.ipynb; then read the new outputs against the notebooks' text and commit notebooks/ and "
       "docs/figures/.")


def builds_now(name):
    """(configs, run fields, the trained model's source) that notebook `name`, executed now outside smoke
    mode, would record."""
    if uses_a_model(name):
        config = _setup.train_config(smoke=False)
        # The loaded model's 'auto' fields are chosen for this backend (checkpoint.saved_model_config).
        return {"model": resolve_auto(ModelConfig.from_dict(config.model)).cfg}, _setup.run_fields(config), \
            _setup.OWN_MODEL
    if name == "retrieval_heads":
        config = _setup.recall_config(smoke=False)
        fields = _setup.run_fields(config, _setup.RUN_FIELDS + _setup.NEEDLE_FIELDS)
        return {"model": resolve_auto(ModelConfig.from_dict(config.model)).cfg}, fields, _setup.RECALL_MODEL
    if name == "tables":
        config = _setup.tables_config(smoke=False)
        fields = _setup.run_fields(config, _setup.RUN_FIELDS + _setup.TABLES_FIELDS)
        return {"model": resolve_auto(ModelConfig.from_dict(config.model)).cfg}, fields, _setup.TABLES_MODEL
    if name == "proteins":
        config = _setup.proteins_config(smoke=False)
        fields = _setup.run_fields(config, _setup.RUN_FIELDS + _setup.PROTEINS_FIELDS)
        return {"model": resolve_auto(ModelConfig.from_dict(config.model)).cfg}, fields, _setup.PROTEINS_MODEL
    if name == "attention_sinks":  # its own runs (configs/sweeps/sinks.py) with their training fields, no one model
        return (*_setup.sinks_configs(smoke=False), None)
    if name == "vision":  # its three ViT runs (configs/vit.py with 0 and 4 registers, configs/vit_digits.py)
        runs = _setup.vision_configs(smoke=False)
        return ({k: resolve_auto(ModelConfig.from_dict(c.model)).cfg for k, c in runs.items()},
                {k: _setup.run_fields(c) for k, c in runs.items()}, None)
    if name == "looking_inside":  # its three runs of configs/modern_b32.py
        runs = _setup.looking_configs(smoke=False)
        return ({k: resolve_auto(ModelConfig.from_dict(c.model)).cfg for k, c in runs.items()},
                {k: _setup.run_fields(c) for k, c in runs.items()}, None)
    if name == "features":  # the default run (`make train`) and configs/sae.py's SAEs on it
        from configs import modern, sae

        config = modern.get_config()
        fields = {**_setup.run_fields(config), **{f"sae.{k}": v for k, v in sae.get_config().sae.items()
                                                   if k not in ("run", "data_path")}}
        return {"model": resolve_auto(ModelConfig.from_dict(config.model)).cfg}, fields, "configs/modern.py"
    model_free = {"attention_basics": lambda: {"section 4": _setup.lecture_layer_config()},
                  "kv_cache": lambda: _setup.kv_cache_variants(smoke=False)}
    return model_free[name](), None, None


def differences(recorded, now, prefix=""):
    """'key: recorded -> now' for every key whose value differs (nested dicts compared key by key)."""
    out = []
    for key in sorted(set(recorded or {}) | set(now or {})):
        a, b = (recorded or {}).get(key, "<missing>"), (now or {}).get(key, "<missing>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


def with_new_fields(configs):
    """Recorded configs with the ModelConfig fields added since, at their defaults: a field a record
    lacks was not there to set, and its default keeps the model what it was (as for checkpoints)."""
    defaults = {f.name: f.default for f in ModelConfig.fields() if f.default is not dataclasses.MISSING}
    return {name: {**defaults, **fields} for name, fields in (configs or {}).items()}


def provenance_record(nb, path):
    """The provenance record of a committed notebook: exactly one, in its first code cell."""
    found = [(i, o) for i, c in enumerate(c for c in nb.cells if c.cell_type == "code") for o in c.outputs
             if _setup.PROVENANCE_MIME in o.get("data", {})]
    assert len(found) == 1 and found[0][0] == 0, (
        f"{path}: {'no' if not found else len(found)} provenance record(s) (an output of type "
        f"{_setup.PROVENANCE_MIME}, from _setup.provenance or _setup.load_model, in the first code cell): the "
        f"committed outputs do not say which code made them. {FIX}")
    record = found[0][1]["data"][_setup.PROVENANCE_MIME]
    return json.loads(record) if isinstance(record, str) else record


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebook_is_from_todays_code(name):
    path = f"notebooks/{name}.ipynb"
    nb = nbformat.read(os.path.join(ROOT, path), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]

    errors = [f"code cell {i + 1}: {o.get('ename', '')} {o.get('evalue', '')}".strip() for i, c in enumerate(code)
              for o in c.outputs if o.output_type == "error"
              or "Traceback (most recent call last)" in o.get("text", "") + o.get("data", {}).get("text/plain", "")]
    assert not errors, f"{path}: committed outputs hold errors ({'; '.join(errors)}). {FIX}"
    counts = [c.execution_count for c in code]
    assert counts == list(range(1, len(code) + 1)), (
        f"{path}: the code cells were not executed once each, top to bottom, in one run (execution counts "
        f"{counts}). {FIX}")

    record = provenance_record(nb, path)
    assert re.fullmatch(r"[0-9a-f]{7,40}(\+dirty)?", str(record.get("commit"))), (
        f"{path}: the recorded commit {record.get('commit')!r} is not a git commit. {FIX}")
    assert record.get("smoke") is False, f"{path}: executed with NOTEBOOK_SMOKE=1 (the tests' tiny model). {FIX}"
    configs, run, source = builds_now(name)
    now = {"configs": {k: cfg.to_dict() for k, cfg in configs.items()}, "run": run}
    stale = differences({"configs": with_new_fields(record.get("configs")), "run": record.get("run")},
                        json.loads(json.dumps(now)))
    if source is not None:
        model = record.get("model") or {}
        assert model.get("from") == source, (
            f"{path}: executed on the model {model.get('run')!r} from {model.get('from')!r}, not the notebook's "
            f"own model ({source}); unset NOTEBOOK_CHECKPOINT. {FIX}")
        if model.get("step") != run["train.steps"]:
            stale.append(f"model step: {model.get('step')!r} -> {run['train.steps']!r}")
    assert not stale, (
        f"{path} was executed at commit {record.get('commit')} with configs that today's code no longer "
        f"builds ({'; '.join(stale)}): its outputs and figures are stale. {FIX} If runs/notebook_model was "
        "trained with the old config, delete it first so that it is trained again.")


def module_file(name, root=ROOT):
    """The file of module `name` (transformer.model.ops) in the checkout at `root`; None if it has none now."""
    base = os.path.join(root, *name.split("."))
    return next((f for f in (base + ".py", os.path.join(base, "__init__.py")) if os.path.isfile(f)), None)


def changed_modules(recorded, root=ROOT):
    """The modules of a provenance record's digests {name: digest} whose file differs today (or is gone)."""
    return sorted(name for name, digest in recorded.items()
                  if module_file(name, root) is None or _setup.file_digest(module_file(name, root)) != digest)


def stale_notebooks(root=ROOT):
    """{notebook: the transformer modules it loaded that changed since it was executed}; a record
    without digests (executed before they were recorded) is listed as such."""
    stale = {}
    for name in NOTEBOOKS:
        record = provenance_record(nbformat.read(os.path.join(root, "notebooks", f"{name}.ipynb"), as_version=4), name)
        changed = ["(no module digests recorded)"] if "modules" not in record else changed_modules(record["modules"], root)
        if changed:
            stale[name] = changed
    return stale


def test_no_notebook_was_executed_on_modules_changed_since():
    stale = stale_notebooks()
    assert not stale, ("notebooks executed on transformer modules that have changed since: "
                       + "; ".join(f"{n}: {', '.join(m)}" for n, m in stale.items()) + f". {FIX}")


def test_a_changed_module_is_found(tmp_path):
    package = tmp_path / "transformer" / "model"
    package.mkdir(parents=True)
    (tmp_path / "transformer" / "__init__.py").write_text("")
    (package / "ops.py").write_text("x = 1\n")
    recorded = {"transformer": _setup.file_digest(str(tmp_path / "transformer" / "__init__.py")),
                "transformer.model.ops": _setup.file_digest(str(package / "ops.py"))}
    assert changed_modules(recorded, str(tmp_path)) == []
    (package / "ops.py").write_text("x = 2\n")
    assert changed_modules(recorded, str(tmp_path)) == ["transformer.model.ops"]
    (package / "ops.py").unlink()
    assert changed_modules(recorded, str(tmp_path)) == ["transformer.model.ops"]
    # What the kernel records: every loaded transformer module, with its file's digest.
    digests = _setup.module_digests()
    assert "transformer" in digests and changed_modules(digests) == []


def test_commit_is_marked_dirty_by_uncommitted_code_only(tmp_path):
    if not shutil.which("git"):
        pytest.skip("git is not installed")

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    for file in ("transformer/model/decoder.py", "notebooks/_setup.py", "notebooks/a.ipynb", "docs/notes.md"):
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / file).write_text("x\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    head = _setup.commit(str(tmp_path))
    assert re.fullmatch(r"[0-9a-f]{7,}", head)
    (tmp_path / "notebooks" / "a.ipynb").write_text("outputs\n")  # `make figures` rewrites the notebooks
    (tmp_path / "docs" / "notes.md").write_text("y\n")
    (tmp_path / "transformer" / "new.py").write_text("untracked\n")
    assert _setup.commit(str(tmp_path)) == head
    for file in ("transformer/model/decoder.py", "notebooks/_setup.py"):
        (tmp_path / file).write_text("changed\n")
        assert _setup.commit(str(tmp_path)) == head + "+dirty"
        git("checkout", "-q", "--", file)
    assert _setup.commit(str(tmp_path / "nowhere")) == "unknown"


# --- Where things go -------------------------------------------------------------------------


def test_figures_go_to_the_run_unless_a_folder_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # holds no runs/: relative paths are read from the repository root
    assert _setup.figures_folder({}, smoke=False) == os.path.join(ROOT, "runs", "notebook_model", "figures")
    assert _setup.figures_folder({"NOTEBOOK_WORKDIR": "runs/mine"}, smoke=False) == os.path.join(
        ROOT, "runs", "mine", "figures")
    assert _setup.figures_folder({"NOTEBOOK_CHECKPOINT": "runs/x", "NOTEBOOK_WORKDIR": "runs/mine"},
                                 smoke=False) == os.path.join(ROOT, "runs", "x", "figures")
    assert _setup.figures_folder({"NOTEBOOK_FIGURES": "docs/figures"}, smoke=False) == os.path.join(
        ROOT, "docs", "figures")  # what `make figures` sets: the only way into docs/
    assert not _setup.figures_folder({}, smoke=True).startswith(ROOT + os.sep)

    (tmp_path / "runs" / "x").mkdir(parents=True)  # a path that exists from the current folder wins
    assert _setup.figures_folder({"NOTEBOOK_CHECKPOINT": "runs/x"}, smoke=False) == str(tmp_path / "runs" / "x" / "figures")


def make(*args):
    if not shutil.which("make"):
        pytest.skip("make is not installed")
    return subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
def test_make_plot_draws_the_named_run_and_only_make_figures_writes_docs():
    plot = make("plot", "RUN=x")
    assert "scripts/plot_metrics.py x/metrics.jsonl x/loss_curve.png" in plot and "docs/" not in plot
    assert "runs/shakespeare/metrics.jsonl runs/shakespeare/loss_curve.png" in make("plot")
    figures = make("-W", "pyproject.toml", "figures")  # as if pyproject.toml had changed: installs first
    assert "pip install -q -e '.[notebooks]'" in figures and "touch .venv/.installed-notebooks" in figures
    assert "runs/shakespeare/metrics.jsonl docs/loss_curve.png" in figures
    assert f"NOTEBOOK_FIGURES={ROOT}/docs/figures" in figures and "--execute --inplace notebooks/*.ipynb" in figures
    assert "pip install -q -e '.[notebooks]'" in make("-W", "pyproject.toml", "notebooks")


@pytest.mark.slow
def test_plot_metrics(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": s, "loss": 3.0 - 0.1 * s} for s in range(1, 6)] + [{"step": 5, "val_loss": 2.6}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for source in (run / "metrics.jsonl", run):  # the file or the run's folder
        (run / "loss_curve.png").unlink(missing_ok=True)
        plot_metrics.plot(str(source), str(run / "loss_curve.png"), target=2.5)
        assert (run / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    with pytest.raises(SystemExit, match="cannot write .*curve.txt.*image extension such as .png"):
        plot_metrics.plot(str(run), str(tmp_path / "curve.txt"))
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(SystemExit, match="holds no training rows yet"):
        plot_metrics.plot(str(run), str(tmp_path / "out.png"))

    missing = tmp_path / "nothing" / "metrics.jsonl"  # what `make plot RUN=...` shows before training
    done = subprocess.run([sys.executable, plot_metrics.__file__, str(missing), str(tmp_path / "out.png")],
                          capture_output=True, text=True)
    assert done.returncode == 1 and f"no metrics file at {missing}: train the run first" in done.stderr
    assert not (tmp_path / "out.png").exists()


# --- A run of the user's own: MLA, BPE, a relative data.path ----------------------------------


def set_saved_data_path(workdir, path):
    """Rewrites data.path in every saved config of the run, as an old train.py stored it."""
    files = glob.glob(os.path.join(workdir, "checkpoints", "*", "config", "metadata"))
    assert files, f"no saved config under {workdir}/checkpoints/*/config/: has the checkpoint layout changed?"
    for file in files:
        with open(file) as f:
            config = json.load(f)
        config["data"]["path"] = path
        with open(file, "w") as f:
            json.dump(config, f)
    from transformer.run.checkpoint import Checkpointer

    assert Checkpointer(workdir, read_only=True).config()["data"]["path"] == path


@pytest.fixture(scope="module")
def own_run(tmp_path_factory):
    """A relative workdir under runs/ of a 6-step MLA + BPE run on a small text at a relative path."""
    os.makedirs(os.path.join(ROOT, "runs"), exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="test-notebooks-", dir=os.path.join(ROOT, "runs"))
    rel = os.path.relpath(workdir, ROOT)
    words = "the king spoke to his queen while a fox ran over the hill and the dog slept".split()
    lines = [" ".join(words[(7 * i + j) % len(words)] for j in range(9)) for i in range(400)]
    with open(os.path.join(workdir, "corpus.txt"), "w") as f:
        f.write("\n".join(lines))
    cache = tmp_path_factory.mktemp("tokens")
    try:
        subprocess.run(
            [sys.executable, "train.py", "--config", "configs/tiny.py", "--workdir", rel,
             "--config.model.attention=mla", "--config.model.kv_latent_dim=16",
             "--config.data.tokenizer=bpe", "--config.model.vocab_size=300", f"--config.data.path={rel}/corpus.txt",
             "--config.train.steps=6", "--config.train.eval_every=3", "--config.train.checkpoint_every=3",
             "--config.train.sample_tokens=0", f"--config.data.cache_dir={cache}"],
            cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"}, check=True, capture_output=True, timeout=600)
        set_saved_data_path(workdir, f"{rel}/corpus.txt")  # train.py may store it absolute now
        yield rel
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.slow
def test_data_path_of_a_run(own_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NOTEBOOK_DATA", raising=False)
    workdir = os.path.join(ROOT, own_run)
    assert _setup.data_path(workdir) == os.path.join(ROOT, own_run, "corpus.txt")  # from the root, not cwd

    moved = tmp_path / "moved"
    shutil.copytree(workdir, moved)
    set_saved_data_path(str(moved), "runs/gone/corpus.txt")
    with pytest.raises(FileNotFoundError) as e:
        _setup.data_path(str(moved))
    assert "data.path 'runs/gone/corpus.txt': no text at " + os.path.join(ROOT, "runs/gone/corpus.txt") in str(e.value)
    assert "Set NOTEBOOK_DATA" in str(e.value)

    monkeypatch.setenv("NOTEBOOK_DATA", os.path.join(own_run, "corpus.txt"))  # from the root
    assert _setup.data_path(str(moved)) == os.path.join(ROOT, own_run, "corpus.txt")
    monkeypatch.setenv("NOTEBOOK_DATA", "nowhere.txt")
    with pytest.raises(FileNotFoundError, match="NOTEBOOK_DATA='nowhere.txt': no text at .*Set NOTEBOOK_DATA"):
        _setup.data_path(str(moved))


@pytest.mark.slow
def test_a_missing_checkpoint_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NOTEBOOK_CHECKPOINT", "runs/no-such-run")
    with pytest.raises(FileNotFoundError, match="NOTEBOOK_CHECKPOINT='runs/no-such-run' is not a folder.*make train"):
        _setup.load_model()


# --- Running the notebooks ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """A Jupyter folder with a kernel spec that runs this interpreter."""
    jupyter = tmp_path_factory.mktemp("jupyter")
    spec = jupyter / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "transformer tests", "language": "python",
    }))
    return jupyter


def docs_state():
    """git's view of docs/ and every file's modification time there."""
    status = subprocess.run(["git", "status", "--porcelain", "docs/"], cwd=ROOT, capture_output=True, text=True)
    files = glob.glob(os.path.join(ROOT, "docs", "**"), recursive=True)
    return status.stdout, {f: os.stat(f).st_mtime_ns for f in files if os.path.isfile(f)}


# The environment variable that points a notebook at its own tiny model's folder, by model.
OWN_MODEL_FOLDERS = {"notebook_model": "NOTEBOOK_WORKDIR", "recall_model": "NOTEBOOK_RECALL_WORKDIR",
                     "looking_model": "NOTEBOOK_LOOKING_WORKDIR", "tables_model": "NOTEBOOK_TABLES_WORKDIR",
                     "vision_model": "NOTEBOOK_VISION_WORKDIR", "proteins_model": "NOTEBOOK_PROTEINS_WORKDIR"}
# The models trained by one notebook of a task of its own: (_setup's name for it, its data.task).
TASK_MODELS = {"recall_model": (_setup.RECALL_MODEL, "needle"), "tables_model": (_setup.TABLES_MODEL, "tables"),
               "proteins_model": (_setup.PROTEINS_MODEL, "proteins")}


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory):
    """model -> its folder, made on first use and shared by the notebooks of this module: the first
    notebook that needs a model trains it there."""
    folders = {}

    def folder(model: str) -> str:
        if model not in folders:
            folders[model] = str(tmp_path_factory.mktemp(model))
        return folders[model]

    return folder


# Every notebook on the user's run, but those of OWN_MODELS, which train models of their own (the needle task, a longer run) and
# trains its own; those that load a model also on the notebooks' own.
@pytest.mark.parametrize("name,model", [  # one kept in `make test` (tests/end_to_end.py), the others slow
    pytest.param(name, model, marks=() if (name, model) == ("head_ablation", "notebook_model") else pytest.mark.slow)
    for name, model in [(n, "own_run") for n in NOTEBOOKS if n not in OWN_MODELS]
    + [(n, "notebook_model") for n in NOTEBOOKS if uses_a_model(n)] + [("retrieval_heads", "recall_model"),
                                                                       ("looking_inside", "looking_model"),
                                                                       ("tables", "tables_model"),
                                                                       ("vision", "vision_model"),
                                                                       ("proteins", "proteins_model")]])
def test_notebook_runs(name, model, request, kernels, model_folders, tmp_path, monkeypatch):
    work = tmp_path / "notebooks"
    shutil.copytree(os.path.join(ROOT, "notebooks"), work, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    for var in ("NOTEBOOK_CHECKPOINT", "NOTEBOOK_FIGURES", "NOTEBOOK_DATA", *OWN_MODEL_FOLDERS.values()):
        monkeypatch.delenv(var, raising=False)
    if model in OWN_MODEL_FOLDERS:
        run = model_folders(model)
        monkeypatch.setenv(OWN_MODEL_FOLDERS[model], run)
    else:
        relative = request.getfixturevalue("own_run")
        assert not (work / relative).exists()  # so it must be found from the repository root
        monkeypatch.setenv("NOTEBOOK_CHECKPOINT", relative)
        run = os.path.join(ROOT, relative)
    monkeypatch.setenv("JUPYTER_PATH", str(kernels))  # searched before any other kernel folder
    monkeypatch.setenv("NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("TRANSFORMER_ROOT", ROOT)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    before = docs_state()

    nb = nbformat.read(work / f"{name}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name=KERNEL, resources={"metadata": {"path": str(work)}})
    client.execute()  # raises CellExecutionError (the failing cell and its traceback) on any error

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 1, f"{name} drew no figure"
    record = provenance_record(nb, name)
    assert record["smoke"] is True and record["commit"]
    assert "transformer" in record["modules"] and changed_modules(record["modules"]) == []
    if uses_a_model(name):
        text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
        assert f"model: {os.path.relpath(run, ROOT) if model == 'own_run' else run}, step" in text
        assert record["model"]["from"] == ("NOTEBOOK_CHECKPOINT" if model == "own_run" else _setup.OWN_MODEL)
        assert record["configs"]["model"]["attention"] == ("mla" if model == "own_run" else "mha")
    if model in TASK_MODELS:
        text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
        source, task = TASK_MODELS[model]
        assert f"model: {run}, step 10" in text and record["model"]["from"] == source
        assert record["run"]["data.task"] == task
    if model == "looking_model":
        runs = {"default": 10, "long": 20, "copying": 20}
        assert record["model"]["step"] == runs and set(record["configs"]) == set(runs)
        assert all(os.path.isfile(os.path.join(run, name, "metrics.jsonl")) for name in runs)
        assert record["run"]["copying"]["data.path"] == os.path.join(run, "copying.txt")  # the corpus it wrote
    assert os.path.isfile(os.path.join(run, "figures", f"{name}.png")), "figures go to the run's folder"
    assert docs_state() == before, "running a notebook must not change docs/"
