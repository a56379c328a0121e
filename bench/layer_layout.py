"""The layer stack's two layouts, nn.scan against a Python loop: train step, its compile time, decoding.

    python bench/layer_layout.py            # lecture GPT (L 4), baby GPT's width at L 6 and 12
    python bench/layer_layout.py --quick    # lecture GPT and baby GPT at L 6, fewer rounds

On 2 cores shared with a test suite (load average 2-4) the full run took 9 minutes and --quick
(load average 6) nearly 5; on idle cores expect about half.

`ModelConfig.scan_layers` True runs the layers as one `nn.scan` (parameters stacked on a leading
layer axis, one layer compiled); False as a Python loop (layers_0 ... layers_{L-1}, every layer in
the program). Models: configs/shakespeare.py's (L 4, d 128, batch 32 x 128) and configs/baby_gpt.py's
width (d 384, 6 heads, batch 16 x 256) at 6 and 12 layers; random weights and tokens, float32 on the
CPU. For each model, in both layouts:

- train: seconds per train step (transformer.training.steps.make_train_step: forward, backward,
  AdamW; driven as bench/train.py drives it), after an untimed warm-up step; each round takes the
  median of a few single steps per layout;
- compile: the train step traced, lowered and compiled by XLA from abstract inputs
  (bench/compile.py's `compile_seconds`), a distinct program per call, so no cache hides a compile;
- decode: ms per token of the sampler's KV-cache decode (`sampling.decode`, greedy, batch 1, 32
  steps after a 16-token prompt, a 64-slot cache), from the same weights in the two layouts: the
  stacked tree, which `decode` unrolls inside its jit at every call (`param_tree.unrolled`), and the
  unrolled tree the small CPU configs save (scan_layers=False); and the compiled decode's temporary bytes (XLA's memory
  analysis, which does not depend on the machine's load): what the stacked tree's unroll copies
  out of the stack at each call. The sampler has no code path that decodes with the scan kept
  (`decode` always unrolls), so that third case is not measured.

The two layouts alternate within every round (scan, loop, scan, loop, ...) so that a busy moment of
this shared machine hits both; a ratio is scan / loop of the same round, given as the median over
rounds and its min-max. Compare ratios from one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable

import numpy as np

from bench import timing
from bench.compile import compile_seconds
from bench.steps import GREEDY, decode_start, model_config, random_params
from bench.train import Ours
from configs import baby_gpt, shakespeare
from transformer import sampling
from transformer.model.param_tree import unrolled

LAYOUTS = {"scan": True, "loop": False}  # name -> scan_layers
PROMPT_LEN, DECODE_STEPS, CACHE_LEN = 16, 32, 64


def models(quick: bool) -> dict[str, tuple]:
    """{name: (config, number of layers)}: the lecture GPT, baby GPT's width at 6 (and 12) layers."""
    chosen = {"shakespeare (L 4, d 128)": (shakespeare.get_config(), 4),
              "baby_gpt (L 6, d 384)": (baby_gpt.get_config(), 6)}
    if not quick:
        chosen["baby_gpt at L 12 (d 384)"] = (baby_gpt.get_config(), 12)
    return chosen


def rounds(timers: dict[str, Callable[[], float]], count: int, unit: str) -> dict[str, list[float]]:
    """Each timer's seconds in each of `count` rounds, the timers taking turns (timing.alternate);
    a progress line per round on stderr, in ms or s (`unit`)."""
    scale = {"ms": 1e3, "s": 1.0}[unit]
    kept: dict[str, list[float]] = {}

    def progress(times: dict[str, list[float]]) -> None:
        kept.update(times)
        last = ", ".join(f"{name} {t[-1] * scale:.2f} {unit}" for name, t in times.items())
        print(f"    {last}", file=sys.stderr)

    timing.alternate(timers, count, after_round=progress)
    return kept


def median_of(fn: Callable[[], float], repeats: int) -> Callable[[], float]:
    """A timer: the median of `repeats` calls of the timer fn."""
    return lambda: statistics.median(fn() for _ in range(repeats))


def ratio(times: dict[str, list[float]]) -> str:
    """scan / loop, round by round: 'median (min-max)'."""
    r = [s / loop for s, loop in zip(times["scan"], times["loop"], strict=True)]
    return f"{statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})"


def train_times(config, num_layers: int, steps: int, count: int) -> tuple[dict[str, list[float]], int]:
    """(seconds per train step, by layout and round; the number of parameters)."""
    runners = {name: Ours(config, num_layers=num_layers, scan_layers=scan) for name, scan in LAYOUTS.items()}
    for runner in runners.values():
        runner.run(1)  # compile, warm up
    step = lambda runner: timing.seconds(lambda: runner.run(1))  # noqa: E731
    timers = {name: median_of(lambda r=r: step(r), steps) for name, r in runners.items()}
    return rounds(timers, count, "ms"), runners["scan"].num_params


def compile_times(config, num_layers: int, count: int) -> dict[str, list[float]]:
    """Trace + lower + compile seconds of the train step, by layout and round."""
    timers = {name: lambda scan=scan: sum(compile_seconds(config, num_layers, scan)) for name, scan in LAYOUTS.items()}
    return rounds(timers, count, "s")


def decode_times(config, num_layers: int, calls: int,
                 count: int) -> tuple[dict[str, list[float]], dict[str, int], bool]:
    """(seconds per decoded token, by layout and round; the compiled decode's temporary bytes, by
    layout; whether the two layouts drew the same greedy tokens). The same random weights, stacked
    and unrolled."""
    cfg = model_config(config.model, num_layers=num_layers, scan_layers=True)
    stacked = random_params(cfg)
    trees = {"scan": (stacked, cfg), "loop": unrolled(stacked, cfg)}
    runs, temporaries, tokens = {}, {}, {}
    for name, (params, c) in trees.items():
        state = decode_start(c, params, 1, PROMPT_LEN, CACHE_LEN)
        compiled = sampling.decode.lower(params, c, state, DECODE_STEPS, GREEDY).compile()
        temporaries[name] = compiled.memory_analysis().temp_size_in_bytes
        runs[name] = lambda params=params, c=c, state=state: sampling.decode(params, c, state, DECODE_STEPS, GREEDY)
        tokens[name] = np.asarray(timing.timed(runs[name])[0][1])  # compile; the drawn tokens
    timers = {name: median_of(lambda run=run: timing.seconds(run) / DECODE_STEPS, calls) for name, run in runs.items()}
    return rounds(timers, count, "ms"), temporaries, bool(np.array_equal(tokens["scan"], tokens["loop"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two models, fewer rounds")
    args = parser.parse_args()
    count = 3 if args.quick else 5  # rounds of train steps and decodes
    compile_count = 2 if args.quick else 3
    start_load = "%.1f, %.1f, %.1f" % os.getloadavg()

    compile_seconds(shakespeare.get_config(), 1, False)  # JAX's and XLA's one-time start-up costs, not timed
    train_rows, decode_rows = [], []
    for name, (config, num_layers) in models(args.quick).items():
        small = config.model.d_model <= 128
        steps = (3 if args.quick else 5) if small else (1 if args.quick else 2)  # single steps per round and layout
        print(f"{name}: compile", file=sys.stderr)
        comp = compile_times(config, num_layers, compile_count)
        print(f"{name}: train", file=sys.stderr)
        train, num_params = train_times(config, num_layers, steps, count)
        print(f"{name}: decode", file=sys.stderr)
        decode, temporaries, same = decode_times(config, num_layers, 3, count)
        t = config.train
        med = lambda times, layout, scale: f"{statistics.median(times[layout]) * scale:.2f}"  # noqa: E731
        train_rows.append(
            f"| {name}, B {t.batch_size} x T {t.seq_len} | {num_params / 1e6:.2f}M "
            f"| {med(train, 'scan', 1e3)} | {med(train, 'loop', 1e3)} | {ratio(train)} "
            f"| {med(comp, 'scan', 1)} | {med(comp, 'loop', 1)} | {ratio(comp)} |")
        mb = lambda layout: f"{temporaries[layout] / 2**20:.1f}"  # noqa: E731
        decode_rows.append(f"| {name} | {num_params * 4 / 2**20:.1f} | {med(decode, 'scan', 1e3)} "
                           f"| {med(decode, 'loop', 1e3)} | {ratio(decode)} | {mb('scan')} | {mb('loop')} "
                           f"| {'yes' if same else 'no'} |")

    end_load = "%.1f, %.1f, %.1f" % os.getloadavg()
    print(f"### The layer stack's two layouts: nn.scan (scan) against a Python loop (loop), float32 on "
          f"{os.cpu_count()} CPU cores (load average {start_load} at the start, {end_load} at the end)\n")
    print(f"Medians over {count} alternating rounds (compile: {compile_count}); a ratio is scan / loop in the "
          "same round, its median (min-max over rounds); above 1 the scan is slower.\n")
    print("| model | params | train ms/step: scan | loop | scan / loop | compile s: scan | loop | scan / loop |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(train_rows))
    print(f"\nDecoding (`sampling.decode`, greedy, batch 1, {DECODE_STEPS} steps after a {PROMPT_LEN}-token "
          f"prompt, {CACHE_LEN} slots), the same weights: the stacked tree (decode unrolls it inside its jit, "
          "at every call) against the unrolled tree. No sampler path decodes with the scan kept.\n")
    print("| model | weights MiB | ms/token: stacked tree | unrolled tree | stacked / unrolled "
          "| temporaries MiB: stacked tree | unrolled tree | same tokens |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(decode_rows))


if __name__ == "__main__":
    main()
