"""Runs every benchmark and writes their tables to one Markdown file.

    python bench/run_all.py --out bench/results.md            # ~1 hour on 2 cores (time to quality: ~45 min)
    python bench/run_all.py --out bench/results.md --quick    # short runs of each

Each benchmark (train.py, compile.py, memory.py, decode.py, op_profile.py for a train and a decode
step, time_to_quality.py, which also draws docs/figures/time_to_quality.png, and layer_layout.py,
nn.scan against a Python loop in training, compiling and decoding) runs as its own
process, one after the other, so none shares the CPU or JAX's caches with another. Their Markdown
output is collected under a header stating the date, the machine (CPU model, core count) and the
library versions. A benchmark that fails leaves its error in the file and the others still run.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
BENCHMARKS = (  # (title, script, its arguments; --quick is added in quick mode where it has one)
    ("Training throughput and MFU", "train.py", ()),
    ("Compile time against depth", "compile.py", ()),
    ("Train-step memory", "memory.py", ()),
    ("Decoding", "decode.py", ()),
    ("Profile: the baby-GPT train step", "op_profile.py", ()),
    ("Profile: a GPT-2-small decode step", "op_profile.py", ("--decode", "--config", "gpt2")),
    ("Time to quality", "time_to_quality.py", ()),
    ("The layer stack's two layouts", "layer_layout.py", ()),
)
HAS_QUICK = ("train.py", "compile.py", "memory.py", "decode.py", "time_to_quality.py", "layer_layout.py")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def versions() -> str:
    """Library versions, read in a child process so this one never imports JAX or PyTorch."""
    code = ("import jax, jaxlib, flax, optax, torch, transformers; print(f'jax {jax.__version__} "
            "(jaxlib {jaxlib.__version__}), flax {flax.__version__}, optax {optax.__version__}, "
            "torch {torch.__version__}, transformers {transformers.__version__}')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    return result.stdout.strip() or f"(could not read versions: {result.stderr.strip()[-200:]})"


def run(script: str, arguments: tuple[str, ...], quick: bool) -> tuple[str, float, int]:
    """(stdout, seconds, return code) of one benchmark; its stderr (progress) passes through."""
    quick_flag = ["--quick"] if quick and script in HAS_QUICK else []
    command = [sys.executable, os.path.join(BENCH, script), *arguments, *quick_flag]
    print(f"== {' '.join(command[1:])}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    return result.stdout, time.perf_counter() - start, result.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(BENCH, "results.md"), help="the Markdown file to write")
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    args = parser.parse_args()

    date = subprocess.run(["date"], capture_output=True, text=True).stdout.strip()
    try:
        load = "load average %.1f, %.1f, %.1f at the start" % os.getloadavg()
    except OSError:
        load = "load average unknown"
    lines = [
        "# Benchmark results",
        "",
        f"- date: {date}",
        f"- machine: {cpu_model()}, {os.cpu_count()} cores ({platform.machine()}, {platform.system()}), {load}",
        f"- software: Python {platform.python_version()}, {versions()}",
        f"- mode: {'quick (short runs)' if args.quick else 'full'}; command: "
        f"`python bench/run_all.py --out {os.path.relpath(args.out, ROOT)}{' --quick' if args.quick else ''}`",
        "",
        "These machines are shared and noisy: compare ratios within one table, measured in the same run.",
    ]
    for title, script, arguments in BENCHMARKS:
        stdout, seconds, code = run(script, arguments, args.quick)
        lines += ["", f"## {title} (`{' '.join(['bench/' + script, *arguments])}`, {seconds:.0f} s)", ""]
        if code != 0:
            lines += [f"**`bench/{script}` failed with exit code {code}**; its output so far:", ""]
        lines.append(stdout.strip() or "(no output)")
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
