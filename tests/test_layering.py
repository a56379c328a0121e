"""The package's layering (docs/design.md, "Layering"), checked on every import in transformer/.

    model, data          the bottom: neither imports the other, nor anything above
    hf, run, sampling    above model and data: weights in and out (Hugging Face); a run's folder
                         (checkpoints, lock, signals, metric files); sampling. None imports another
                         but sampling, which may read imported weights (hf)
    training             above those: it writes a run's folder and may start from imported weights
    analysis             above training and sampling
    experiments          above analysis: each experiment's data task, metric and analysis
    transformer/*.py     the top-level modules (the public API, command-line helpers) may import anything

Loading a model to sample or analyse (load.py, sampling/) reads checkpoints through run/, so it
imports no training module.

A function-level import counts like a module-level one: deferring an import does not change which
layer depends on which. The scripts (train.py, sample.py, sweep.py) sit on top of everything.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "transformer"
ALLOWED = {  # layer -> the layers its modules may import
    "model": {"model"},
    "data": {"data"},
    "hf": {"model", "data", "hf"},
    "run": {"model", "data", "run"},
    "sampling": {"model", "data", "hf", "sampling"},
    "training": {"model", "data", "hf", "run", "training"},
    "analysis": {"model", "data", "hf", "run", "training", "sampling", "analysis"},
    "experiments": {"model", "data", "hf", "run", "training", "sampling", "analysis", "experiments"},
}


def layer_of(module: str) -> str:
    """'transformer.model.ops' -> 'model'; 'transformer' or a top-level module -> 'top'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else "top"


def imported_modules(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, module) of every `import transformer...` / `from transformer... import x` in a file;
    `from transformer.model import ops` names transformer.model.ops."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "transformer"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "transformer":
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def module_name(path: pathlib.Path, package: pathlib.Path) -> str:
    rel = path.relative_to(package.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def violations(paths, package: pathlib.Path = PACKAGE) -> list[str]:
    """'file:line (layer) imports module (layer)' for each import that its layer may not make."""
    out = []
    for path in paths:
        here = layer_of(module_name(path, package))
        if here == "top":
            continue
        for line, target in imported_modules(path):
            there = layer_of(target)
            if there == "top" or there not in ALLOWED[here]:
                out.append(f"{path.relative_to(package.parent)}:{line} ({here}) imports {target} ({there})")
    return out


def test_no_import_runs_back_up_the_layering():
    paths = sorted(PACKAGE.rglob("*.py"))
    assert len(paths) > 30  # the whole package was read
    assert violations(paths) == []


def test_every_module_sits_in_a_layer_and_the_top_level_is_small():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top[0] == "__init__.py" and len(top) <= 4, top  # __init__ and at most three small modules
    dirs = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert set(dirs) == set(ALLOWED)


@pytest.mark.parametrize("source, bad", [
    ("from transformer.training import checkpoint\n", True),   # model -> training: up
    ("from transformer.data.tokenizer import Tokenizer\n", True),  # model -> data: sideways at the bottom
    ("def f():\n    import transformer.experiments.sinks.sinks\n", True),  # deferred, still up
    ("from transformer.model import ops\n", False),
])
def test_the_check_catches_an_import_that_breaks_the_layering(tmp_path, source, bad):
    probe = tmp_path / "transformer" / "model" / "probe.py"  # a model module in a copy of the tree
    probe.parent.mkdir(parents=True)
    probe.write_text(source)
    found = violations([probe], package=tmp_path / "transformer")
    assert bool(found) == bad, found


def modules_loaded_by(statement: str) -> list[str]:
    """The transformer modules in sys.modules after `statement`, run in a fresh interpreter."""
    code = f"import sys; {statement}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformer'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout
    return ast.literal_eval(out.strip().splitlines()[-1])


# statement -> the layers whose modules it may load (in a fresh interpreter)
LOADS = {
    "import transformer.model.ops": {"model"},
    "import transformer.model": {"model"},
    "import transformer.data; import transformer.data.tasks": {"data"},
    # loading a model to sample or analyse: no training module
    "import transformer.load, transformer.sampling.sampler": {"model", "data", "hf", "run", "sampling", "top"},
    # the package's public names load on use, without training, analysis or experiments
    "import transformer; transformer.Decoder, transformer.load_run, transformer.KVCache": {"model", "data", "run", "top"},
}


def test_importing_a_module_loads_only_what_it_imports():
    """No import-time registration and no package-wide side effect: each statement, in a fresh
    interpreter, loads modules of its own layers only."""
    for statement, layers in LOADS.items():
        loaded = modules_loaded_by(statement)
        assert [m for m in loaded if m != "transformer" and layer_of(m) not in layers] == [], (statement, loaded)
