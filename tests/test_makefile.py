"""The Makefile installs what each target needs and no more (`make -n`: printed, not run)."""

import os
import subprocess
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def dry_run(target: str) -> str:
    """The commands `make TARGET` would run on a fresh checkout (pyproject.toml taken as new)."""
    out = subprocess.run(["make", "-n", "-W", "pyproject.toml", target], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_train_and_sample_install_the_package_alone():
    for target in ("train", "sample"):
        commands = dry_run(target)
        assert "pip install -q -e .\n" in commands
        assert "[dev]" not in commands and "torch" not in commands
    assert "train.py --config configs/modern.py" in dry_run("train")


@pytest.mark.parametrize("target, extra, command", [
    ("test", "dev", "pytest"),
    ("test-all", "dev", "pytest"),
    ("tensorboard", "tensorboard", "tensorboard --logdir runs"),
    ("notebooks", "notebooks", "jupyter lab"),
])
def test_each_tool_installs_its_extra(target, extra, command):
    commands = dry_run(target)
    assert f"pip install -q -e '.[{extra}]'" in commands and command in commands


def test_make_test_leaves_the_slow_tests_to_make_test_all_and_ci_runs_everything():
    assert '-m "not slow"' in dry_run("test")
    everything = dry_run("test-all")
    assert "not slow" not in everything and "scripts/mutation_check.py" in everything
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        assert f.read().rstrip().endswith("make test-all")


def test_training_needs_none_of_the_test_extras():
    project = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]
    runtime = " ".join(project["dependencies"])
    assert "torch" not in runtime and "transformers" not in runtime and "pytest" not in runtime
    assert any(d.startswith("tensorboard") for d in project["optional-dependencies"]["tensorboard"])


def test_the_lecture_sweep_is_one_command_that_rewrites_its_committed_results():
    commands = dry_run("lecture-sweep")
    assert "sweep.py --sweep configs/sweeps/lecture.py --workdir runs/sweeps/lecture" in commands
    assert "docs/sweeps/lecture.md" in commands and "docs/figures/lecture_sweep.png" in commands
    assert "configs/sweeps/lecture_seed1.py" in commands and "docs/sweeps/lecture_seed1.md" in commands


def test_the_recipe_sweep_is_one_command_that_rewrites_its_committed_results():
    commands = dry_run("recipe-sweep")
    assert "sweep.py --sweep configs/sweeps/recipe.py --workdir runs/sweeps/recipe" in commands
    assert "docs/sweeps/recipe.md" in commands and "docs/figures/recipe_sweep.png" in commands


@pytest.mark.parametrize("target", ["train", "sample", "accelerator"])
def test_jax_cuda_and_tpu_install_the_accelerator_extra_instead_of_the_cpu_build(target):
    for build in ("cuda", "tpu"):
        commands = subprocess.run(["make", "-n", "-W", "pyproject.toml", target, f"JAX={build}"],
                                  capture_output=True, text=True, cwd=ROOT).stdout
        assert f"pip install -q -e '.[{build}]'\n" in commands and f"touch .venv/.installed-run-{build}" in commands
        assert "pip install -q -e .\n" not in commands
    assert "pip install -q -e .\n" in dry_run(target)  # the default stays the CPU build
    if target == "accelerator":
        assert "bench/accelerator.py" in dry_run(target)


def test_an_unknown_jax_build_is_a_one_line_error():
    out = subprocess.run(["make", "-n", "train", "JAX=rocm"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0 and "JAX=rocm is not a JAX build" in out.stderr and "JAX=cuda" in out.stderr


def test_the_core_and_the_accelerator_extras_pin_one_jax_version():
    project = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]
    extras = project["optional-dependencies"]
    cuda, tpu = extras["cuda"], extras["tpu"]
    assert len(cuda) == len(tpu) == 1 and cuda[0].startswith("jax[cuda12]==") and tpu[0].startswith("jax[tpu]==")
    version = cuda[0].split("==")[1]
    assert tpu[0].split("==")[1] == version
    core = next(d for d in project["dependencies"] if d.startswith("jax"))
    assert core == f"jax=={version}", core  # CPU, GPU and TPU installs get the version the tests run on
