"""Every notebook runs top to bottom in smoke mode (tiny model, few steps) and draws its figures.

Each notebook executes in memory from a temporary copy of notebooks/: the committed notebooks, their
outputs and docs/figures are not touched, and the tiny model the notebooks train goes to a temporary
folder. The kernel is this test's own Python interpreter, whatever kernels are installed elsewhere.
"""

import json
import os
import shutil
import sys

import nbclient
import nbformat
import pytest

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = ["attention_basics", "attention_maps", "head_ablation", "kv_cache"]
KERNEL = "transformer-notebook-test"


def test_every_notebook_is_tested():
    found = sorted(f[: -len(".ipynb")] for f in os.listdir(os.path.join(ROOT, "notebooks")) if f.endswith(".ipynb"))
    assert found == sorted(NOTEBOOKS)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A kernel spec that runs this interpreter, and one folder for the tiny model (trained by the
    first notebook that needs it, reused by the others)."""
    jupyter = tmp_path_factory.mktemp("jupyter")
    spec = jupyter / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "transformer tests", "language": "python",
    }))
    return jupyter, tmp_path_factory.mktemp("notebook_model")


def mtimes(folder):
    return {f: os.path.getmtime(os.path.join(folder, f)) for f in os.listdir(folder)} if os.path.isdir(folder) else {}


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, tmp_path, shared, monkeypatch):
    jupyter, model_dir = shared
    work = tmp_path / "notebooks"
    shutil.copytree(os.path.join(ROOT, "notebooks"), work, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter))  # searched before any other kernel folder
    monkeypatch.setenv("NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("TRANSFORMER_ROOT", ROOT)
    monkeypatch.setenv("NOTEBOOK_WORKDIR", str(model_dir))
    monkeypatch.delenv("NOTEBOOK_CHECKPOINT", raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    figures = os.path.join(ROOT, "docs", "figures")
    before = mtimes(figures)

    nb = nbformat.read(work / f"{name}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name=KERNEL, resources={"metadata": {"path": str(work)}})
    client.execute()  # raises CellExecutionError (the failing cell and its traceback) on any error

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 1, f"{name} drew no figure"
    assert mtimes(figures) == before, "smoke mode must not overwrite docs/figures"
