"""Compile time of the train step against depth, with and without nn.scan over the layers.

    python bench/compile.py            # depths 2, 6, 12, 24: ~3-4 minutes on 2 cores
    python bench/compile.py --quick    # depths 2 and 24

The model has baby GPT's width (configs/baby_gpt.py: d 384, 6 heads, context 256, batch 16 x 256);
only the number of layers changes. For each depth and layer loop, the full train step
(transformer.training.steps.make_train_step: forward, backward, AdamW) is traced and lowered to StableHLO
("trace"), then compiled by XLA ("compile"), from abstract inputs: no parameters are allocated and
no step runs; a 1-layer compile first absorbs one-time start-up costs. With nn.scan the compiled
program holds one layer whatever the depth, so its compile time should stay flat (the target: 24
layers at most 1.5x 2 layers); a Python loop unrolls every layer into the program, so its compile
time grows with depth.

Each (depth, scan) pair is a distinct program, compiled once, so no cache hides any compilation.
These machines are shared and noisy: compare ratios from one run.
"""

from __future__ import annotations

import argparse
import sys

from bench import timing
from bench.steps import train_setup
from configs import baby_gpt


def compile_seconds(config, num_layers: int, scan_layers: bool) -> tuple[float, float]:
    """(trace + lower seconds, XLA compile seconds) of the train step at this depth."""
    run = train_setup(config, abstract=True, num_layers=num_layers, scan_layers=scan_layers)
    lowered, trace = timing.timed(run.lower)
    return trace, timing.seconds(lowered.compile)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="depths 2 and 24 only")
    args = parser.parse_args()
    depths = (2, 24) if args.quick else (2, 6, 12, 24)
    config = baby_gpt.get_config()

    compile_seconds(config, 1, False)  # warm-up: JAX's and XLA's one-time start-up costs, not timed
    seconds: dict[tuple[int, bool], tuple[float, float]] = {}
    for depth in depths:
        for scan in (True, False):
            seconds[depth, scan] = compile_seconds(config, depth, scan)
            trace, comp = seconds[depth, scan]
            print(f"  L {depth}, scan {scan}: trace {trace:.1f} s, compile {comp:.1f} s", file=sys.stderr)

    total = {k: sum(v) for k, v in seconds.items()}
    m = config.model
    print(f"### Train-step compile time against depth (d {m.d_model}, {m.num_heads} heads, batch "
          f"{config.train.batch_size} x {config.train.seq_len}, float32, XLA:CPU)\n")
    print("trace = Python tracing and lowering to StableHLO; compile = XLA. Ratios are to the same "
          "loop at the smallest depth.\n")
    print("| layers | scan: trace s | scan: compile s | scan: total s | scan: / L=2 "
          "| loop: trace s | loop: compile s | loop: total s | loop: / L=2 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for depth in depths:
        cells = []
        for scan in (True, False):
            trace, comp = seconds[depth, scan]
            cells += [f"{trace:.1f}", f"{comp:.1f}", f"{trace + comp:.1f}",
                      f"{total[depth, scan] / total[depths[0], scan]:.2f}x"]
        print(f"| {depth} | " + " | ".join(cells) + " |")
    ratio = total[depths[-1], True] / total[depths[0], True]
    verdict = "meets" if ratio <= 1.5 else "misses"
    print(f"\nWith nn.scan, {depths[-1]} layers take {ratio:.2f}x the compile time of {depths[0]} "
          f"({verdict} the 1.5x target); the unrolled loop takes "
          f"{total[depths[-1], False] / total[depths[0], False]:.2f}x.")


if __name__ == "__main__":
    main()
