"""Mutation check (issue #29): break three core pieces of the model, one at a time, in a scratch
copy of the working tree, and require the tests meant to catch each breakage to fail.

    .venv/bin/python scripts/mutation_check.py          # from anywhere; exit 0 iff every mutant is caught
    .venv/bin/python scripts/mutation_check.py --each   # every targeted test must fail, not only the first
    .venv/bin/python scripts/mutation_check.py --keep   # keep the scratch copies (their paths are printed)

The mutants (MUTANTS below) are a causal mask that lets each query see the next token, attention
without its 1/sqrt(d_h) scale, and a KV-cache write one slot past the position. Each is one textual
edit that must match exactly once, so a refactor of the code fails this check by name instead of
quietly testing nothing.

What it does: copies the working tree (tracked files with their uncommitted edits, and untracked
files git does not ignore; not `git archive HEAD`, which would miss work in progress) into a
temporary folder; runs the union of the targeted tests there once unmutated,
which must pass (else the check means nothing); then, for each mutant, a fresh copy with the edit
applied and its targeted tests, `pytest -x`: the mutant is caught when a test fails. The tests run
from the copy's root with PYTHONPATH set to it (the venv's editable install points at the original
tree), and a small pytest plugin records where every `transformer` module was imported from, so a
run that imported the original tree is an error, not a pass.

Exit status: 0 every mutant caught; 1 a mutant survived (named); 2 the check could not run (an
edit that does not apply, a failing baseline, imports from the wrong tree, a collection error).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One breakage: replace `old` (which must occur exactly once in `path`) by `new`; `tests` (pytest
    node ids, cheapest first) are the ones that should fail on it."""

    name: str
    what: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = (
    Mutant(
        name="causal-mask",
        what="every query also sees the next token (key s visible iff pos_s <= pos_t + 1)",
        path="transformer/model/ops.py",
        old="allowed = k_positions[:, None, :] <= q_positions[:, :, None]  # [B, T, S]",
        new="allowed = k_positions[:, None, :] <= q_positions[:, :, None] + 1  # [B, T, S]",
        tests=(
            "tests/test_ops.py::test_causal_mask_from_explicit_positions",
            "tests/test_attention.py::test_attention_is_the_lecture_formula_with_parameters_stored_out_by_in[mha]",
            "tests/test_model.py::test_variant[gqa-rope-post]",
        ),
    ),
    Mutant(
        name="attention-scale",
        what="scores q k^T no longer divided by sqrt(d_h) (default scale 1)",
        path="transformer/model/ops.py",
        old="scale = d_h**-0.5 if scale is None else scale",
        new="scale = 1.0 if scale is None else scale",
        tests=(
            "tests/test_ops.py::test_unmasked_attention_matches_naive_reference",
            "tests/test_ops.py::test_dot_product_attention_equals_textbook_on_joined_repeated_keys[mha-cache-new-mask-decode]",
            "tests/test_attention.py::test_attention_is_the_lecture_formula_with_parameters_stored_out_by_in[gqa]",
        ),
    ),
    Mutant(
        name="cache-write-position",
        what="the KV cache writes position p into slot p + R + 1 instead of p + R",
        path="transformer/model/kv_cache.py",
        old="slot = positions + c.registers  # [B, T]: slot = position + R",
        new="slot = positions + c.registers + 1  # [B, T]: slot = position + R",
        tests=(
            "tests/test_cache.py::test_write_puts_each_row_at_its_own_positions",
            "tests/test_model.py::test_variant[gqa-rope-post]",
            "tests/test_sampling.py::test_greedy_generate_equals_argmax_loop_without_cache[mha]",
        ),
    ),
)

# A pytest plugin (-p), written next to the copies: it records the failed and passed tests, the
# collection errors and the file of every imported `transformer` module into $MUTATION_PROBE_OUT.
PROBE = '''
import json, os, sys

_seen = {"failed": [], "passed": [], "collect_errors": []}


def pytest_collectreport(report):
    if report.failed:
        _seen["collect_errors"].append(report.nodeid or "<session>")


def pytest_runtest_logreport(report):
    if report.failed:
        _seen["failed"].append(report.nodeid if report.when == "call" else f"{report.nodeid} ({report.when})")
    elif report.passed and report.when == "call":
        _seen["passed"].append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    _seen["modules"] = {
        name: getattr(module, "__file__", None)
        for name, module in list(sys.modules.items())
        if name == "transformer" or name.startswith("transformer.")
    }
    with open(os.environ["MUTATION_PROBE_OUT"], "w") as f:
        json.dump(_seen, f)
'''
PROBE_MODULE = "_mutation_probe"


class CheckError(Exception):
    """The check could not run as meant (exit 2): its result would mean nothing."""


@dataclasses.dataclass
class Run:
    """One pytest run in a copy: its exit status, the probe's record, its output and its time."""

    rc: int
    failed: list[str]
    passed: list[str]
    collect_errors: list[str]
    modules: dict[str, str | None]
    output: str
    seconds: float


def working_tree_files(repo: Path) -> list[str]:
    """The working tree's files as the suite sees them (relative paths): the tracked ones still there
    and the untracked ones git does not ignore (new work not yet added, e.g. a new test helper)."""
    cmd = ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    out = subprocess.run(cmd, check=True, capture_output=True).stdout
    paths = dict.fromkeys(p for p in out.decode().split("\0") if p)
    return [p for p in paths if (repo / p).is_symlink() or (repo / p).is_file()]  # no deleted file, no submodule


def copy_tree(repo: Path, files: list[str], dest: Path) -> None:
    """Copies `files` of `repo` into `dest` with their current contents (symlinks as links)."""
    for rel in files:
        src, dst = repo / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def mutated(text: str, mutant: Mutant) -> str:
    """`text` with the mutant's edit made; CheckError unless `old` occurs exactly once."""
    count = text.count(mutant.old)
    if count != 1:
        raise CheckError(
            f"mutant {mutant.name!r}: expected exactly one occurrence of\n    {mutant.old}\nin {mutant.path}, "
            f"found {count}; the code changed: update MUTANTS in scripts/mutation_check.py"
        )
    return text.replace(mutant.old, mutant.new)


def apply(mutant: Mutant, root: Path) -> None:
    """Makes the mutant's edit to its file under `root`."""
    file = root / mutant.path
    if not file.is_file():
        raise CheckError(f"mutant {mutant.name!r}: no file {mutant.path}")
    file.write_text(mutated(file.read_text(), mutant))


def module_name(path: str) -> str:
    """transformer/model/ops.py -> transformer.model.ops."""
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def foreign_modules(modules: dict[str, str | None], root: Path) -> list[str]:
    """The recorded modules whose file does not lie under `root` (imported from another tree)."""
    root = root.resolve()
    return [
        f"{name} from {file}" for name, file in sorted(modules.items())
        if file is not None and not Path(file).resolve().is_relative_to(root)
    ]


def run_tests(root: Path, tests: tuple[str, ...], probe_dir: Path, stop_first: bool, timeout: float) -> Run:
    """pytest on `tests` in the copy at `root`, importing the copy's package; prints the command."""
    record = probe_dir / f"record-{root.name}.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), str(probe_dir)]),  # the copy, never the original tree
        "PYTHONDONTWRITEBYTECODE": "1",
        "MUTATION_PROBE_OUT": str(record),
    }
    cmd = [sys.executable, "-m", "pytest", *(["-x"] if stop_first else []), "-q", "-p", "no:cacheprovider",
           "-p", PROBE_MODULE, *tests]
    print(f"$ cd {shlex.quote(str(root))} && PYTHONPATH={shlex.quote(env['PYTHONPATH'])} {shlex.join(cmd)}",
          flush=True)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise CheckError(f"pytest in {root} ran past {timeout:.0f} s") from e
    seconds = time.perf_counter() - start
    if not record.is_file():
        raise CheckError(f"pytest left no probe record (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    seen = json.loads(record.read_text())
    run = Run(proc.returncode, seen["failed"], seen["passed"], seen["collect_errors"], seen["modules"],
              proc.stdout + proc.stderr, seconds)
    foreign = foreign_modules(run.modules, root)
    if foreign or "transformer" not in run.modules:
        raise CheckError(f"the tests did not import the copy's package at {root}: " + (", ".join(foreign) or "none"))
    if run.collect_errors:
        raise CheckError(f"collection errors in {root}: {run.collect_errors}\n{run.output}")
    return run


def last_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_baseline(scratch: Path, files: list[str], tests: tuple[str, ...], timeout: float) -> None:
    """The unmutated copy must pass every targeted test, each of which must exist; else CheckError."""
    print(f"== baseline: the unmutated copy, {len(tests)} targeted tests must pass", flush=True)
    root = scratch / "baseline"
    copy_tree(REPO, files, root)
    run = run_tests(root, tests, scratch, stop_first=True, timeout=timeout)
    if run.rc != 0 or run.failed:
        raise CheckError(f"the unmutated copy fails its targeted tests (exit {run.rc}):\n{run.output}")
    missing = [t for t in tests if not any(p == t or p.startswith(t + "[") for p in run.passed)]
    if missing:
        raise CheckError(f"targeted tests that did not run (renamed or removed?): {missing}\n{run.output}")
    print(f"   passed: {last_line(run.output)} ({run.seconds:.1f} s)", flush=True)


@dataclasses.dataclass
class Result:
    mutant: Mutant
    caught: bool
    run: Run

    def verdict(self) -> str:
        run = self.run
        if self.caught:
            more = f" (and {len(run.failed) - 1} more)" if len(run.failed) > 1 else ""
            return f"caught by {run.failed[0]}{more}"
        passing = f"; passed despite it: {', '.join(run.passed)}" if run.passed else ""
        return f"SURVIVED (pytest exit {run.rc}{passing})"


def run_mutant(mutant: Mutant, scratch: Path, files: list[str], each: bool, timeout: float) -> Result:
    """A fresh copy with the mutant's edit, its targeted tests run on it (-x unless `each`)."""
    print(f"== mutant {mutant.name}: {mutant.what}\n   {mutant.path}\n   - {mutant.old}\n   + {mutant.new}",
          flush=True)
    root = scratch / mutant.name
    copy_tree(REPO, files, root)
    apply(mutant, root)
    run = run_tests(root, mutant.tests, scratch, stop_first=not each, timeout=timeout)
    if module_name(mutant.path) not in run.modules:  # (foreign_modules already vouched for its file)
        raise CheckError(f"mutant {mutant.name!r}: the tests never imported {mutant.path}")
    # Caught: a test failed (pytest exit 1); with --each, every targeted test failed.
    result = Result(mutant, run.rc == 1 and bool(run.failed) and not (each and run.passed), run)
    print(f"   {result.verdict()} ({run.seconds:.1f} s)", flush=True)
    return result


def check(mutants: tuple[Mutant, ...], each: bool, keep: bool, timeout: float) -> int:
    """Baseline, then every mutant; prints a report and returns the exit status (0 or 1)."""
    for mutant in mutants:  # every edit applies to the tree as it is, before anything runs
        mutated((REPO / mutant.path).read_text(), mutant)
    files = working_tree_files(REPO)
    scratch = Path(tempfile.mkdtemp(prefix="mutation_check_"))
    start = time.perf_counter()
    try:
        (scratch / f"{PROBE_MODULE}.py").write_text(PROBE)
        run_baseline(scratch, files, tuple(dict.fromkeys(t for m in mutants for t in m.tests)), timeout)
        results = [run_mutant(m, scratch, files, each, timeout) for m in mutants]
    finally:
        if keep:
            print(f"scratch copies kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    print(f"\n== summary ({time.perf_counter() - start:.1f} s)")
    for r in results:
        print(f"   {r.mutant.name:22s} {r.verdict()}")
    survived = [r.mutant.name for r in results if not r.caught]
    if survived:
        print(f"mutation check FAILED: mutant(s) survived: {', '.join(survived)}")
        return 1
    print(f"mutation check passed: all {len(results)} mutants caught")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--each", action="store_true",
                        help="run every targeted test of a mutant (no -x) and require each to fail")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copies")
    parser.add_argument("--only", action="append", choices=[m.name for m in MUTANTS],
                        help="check only this mutant (repeatable)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per pytest run (default 600)")
    args = parser.parse_args(argv)
    mutants = tuple(m for m in MUTANTS if not args.only or m.name in args.only)
    try:
        return check(mutants, args.each, args.keep, args.timeout)
    except CheckError as e:
        print(f"mutation check could not run: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
