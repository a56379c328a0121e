"""The device check: what this codebase does on the accelerator JAX finds (GPU, TPU, or the CPU).

    python bench/accelerator.py           # on a GPU or TPU: sized for under 5 minutes (not yet timed there)
    make accelerator JAX=cuda             # the same, after installing the CUDA build of JAX
    python bench/accelerator.py --tiny    # 1-layer stand-ins of the models: seconds on a CPU (the tests)

For the baby GPT (configs/baby_gpt.py) and GPT-2 small (configs/gpt2.py), with random weights, in
bfloat16 (parameters float32) and the attention path `auto` picks for the backend
(transformer/model/execution.py), on one device:

- compile: seconds to trace, lower and compile the train step (forward, backward, AdamW);
- training tokens/s, and MFU: those tokens' model FLOPs (6N + 12 L T d per token, as train.py
  counts them) over the chip's stated dense bfloat16 peak (PEAK_FLOPS; not shown for a chip not in
  that table, e.g. a CPU);
- decode tokens/s of greedy KV-cached generation (sampling.decode) at batch 1 and 64;
- the largest training batch (rows of the same length, doubling from the benchmark's) whose
  compiled step fits the device's memory limit, by XLA's memory analysis: compiled, never run, so
  nothing runs out of memory. A CPU reports no limit; it is not searched there.

Prints a Markdown table. Every figure comes from bench/timing.py's functions (the fastest of a few
runs, results waited for). It is not one of bench/run_all.py's benchmarks: those measure the CPU
that bench/results.md describes, where this check's bfloat16 figures mean little (XLA:CPU computes
bfloat16 through float32), a CPU has no stated peak and reports no memory limit.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Callable

import jax
import numpy as np
from ml_collections import ConfigDict

from bench import timing
from bench.decode import PROMPT_LEN, ours_timer
from bench.memory import memory_sizes, step_memory
from bench.steps import decode_start, random_params, train_setup
from configs import baby_gpt, gpt2

# Dense bfloat16 peak FLOP/s per device, by the device's `device_kind` (first match wins): the
# vendors' stated figures, without sparsity. A TPU v4 or later device is one chip.
PEAK_FLOPS = (
    (r"H100 PCIe", 756e12),
    (r"H100|H200|GH200", 989e12),
    (r"A100", 312e12),
    (r"L40S", 362e12),
    (r"\bL4\b", 121e12),
    (r"TPU v6 lite|TPU v6e", 918e12),
    (r"TPU v5 lite|TPU v5e", 197e12),
    (r"TPU v5p|TPU v5\b", 459e12),
    (r"TPU v4", 275e12),
)
DECODE_BATCHES = (1, 64)
TINY_MODEL = dict(vocab_size=256, max_seq_len=32, d_model=64, num_layers=1, num_heads=2)  # --tiny


def peak_flops(device_kind: str) -> float | None:
    """The stated dense bfloat16 FLOP/s of a device kind (e.g. 'NVIDIA H100 80GB HBM3'), None if unknown."""
    for pattern, flops in PEAK_FLOPS:
        if re.search(pattern, device_kind):
            return flops
    return None


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to measure of one model."""

    name: str
    config: ConfigDict  # its train.batch_size x train.seq_len is the training batch
    overrides: dict  # ModelConfig fields changed from the config's
    train_steps: int  # steps per timed run
    decode_steps: int  # tokens per timed decode run
    batch_cap: int  # the largest-batch search stops here


def plans(tiny: bool) -> list[Plan]:
    """The baby GPT at nanoGPT's GPU batch (64 x 256) and GPT-2 small at 16 x 1024, in bfloat16;
    with --tiny, 1-layer stand-ins of width 64 at batch 2 x 32."""
    out = []
    for name, module, batch, seq_len in (("baby GPT", baby_gpt, 64, 256), ("GPT-2 small", gpt2, 16, 1024)):
        config = module.get_config()
        overrides = dict(dtype="bfloat16")
        if tiny:
            overrides.update(TINY_MODEL)
            batch, seq_len = 2, TINY_MODEL["max_seq_len"]
        config.train.batch_size, config.train.seq_len = batch, seq_len
        out.append(Plan(name, config, overrides, train_steps=2 if tiny else 10, decode_steps=4 if tiny else 64,
                        batch_cap=8 if tiny else 1024))
    return out


@dataclasses.dataclass
class Result:
    name: str
    params: int
    execution: str  # "bfloat16, cudnn"
    batch: int
    seq_len: int
    compile_seconds: float
    tokens_per_sec: float
    mfu: float | None
    decode_tokens_per_sec: dict[int, float]  # batch -> tokens/s
    largest_batch: int | None  # None: the device reports no memory limit


def measure(plan: Plan, peak: float | None, memory_limit: int | None, rounds: int) -> Result:
    """One model's compile time, training throughput, decode throughput and largest batch."""
    t = plan.config.train
    setup = train_setup(plan.config, **plan.overrides)
    lowered, trace_seconds = timing.timed(setup.lower)
    compiled, compile_seconds = timing.timed(lowered.compile)
    print(f"  {plan.name}: compiled in {trace_seconds + compile_seconds:.1f} s", file=sys.stderr, flush=True)

    seconds_per_step = train_seconds(setup, compiled, plan.train_steps, rounds)
    tokens_per_sec = t.batch_size * t.seq_len / seconds_per_step
    print(f"  {plan.name}: {tokens_per_sec:,.0f} training tokens/s", file=sys.stderr, flush=True)

    decode = decode_tokens_per_sec(setup.cfg, plan.decode_steps, rounds)
    largest = None
    if memory_limit is not None:
        peaks = {t.batch_size: memory_sizes(compiled)["peak"]}  # the step compiled above: no compile again
        fits = lambda b: (peaks[b] if b in peaks else step_peak_bytes(plan, b)) <= memory_limit  # noqa: E731
        largest = largest_batch(fits, t.batch_size, plan.batch_cap)
    return Result(
        name=plan.name, params=setup.num_params, execution=f"{setup.cfg.dtype}, {setup.cfg.attention_impl}",
        batch=t.batch_size, seq_len=t.seq_len, compile_seconds=trace_seconds + compile_seconds,
        tokens_per_sec=tokens_per_sec, mfu=None if peak is None else tokens_per_sec * setup.flops_per_token / peak,
        decode_tokens_per_sec=decode, largest_batch=largest,
    )


def train_seconds(setup, compiled, steps: int, rounds: int) -> float:
    """Seconds per train step of the compiled step: the fastest of `rounds` runs of `steps` steps on
    one random batch (the state donated and carried on, as train.py does)."""
    cfg, shape = setup.cfg, setup.batch.shape
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, shape, dtype=np.int32)
    x = jax.device_put(tokens, setup.batch.sharding)
    state = setup.state

    def run():
        nonlocal state
        for _ in range(steps):
            state, metrics = compiled(state, x, x)
        return metrics

    return timing.best(run, rounds) / steps


def decode_tokens_per_sec(cfg, steps: int, rounds: int) -> dict[int, float]:
    """{batch: new tokens per second} of greedy KV-cached decoding after a 16-token prompt."""
    params = random_params(cfg)
    out = {}
    for batch in DECODE_BATCHES:
        state = decode_start(cfg, params, batch, PROMPT_LEN, PROMPT_LEN + steps)
        timer = ours_timer(cfg, params, state, steps)  # seconds per decode step, compiled
        out[batch] = batch / min(timer() for _ in range(rounds))
    return out


def step_peak_bytes(plan: Plan, batch: int) -> int:
    """Peak bytes of the train step at `batch` rows (XLA's memory analysis; compiled, not run)."""
    config = plan.config.copy_and_resolve_references()
    config.train.batch_size = batch
    return step_memory(config, **plan.overrides)["peak"]


def largest_batch(fits: Callable[[int], bool], start: int, cap: int) -> int:
    """The largest of start * 2^k (k >= 0, up to `cap`) for which fits(batch), or the largest of
    start / 2^k below it if start does not fit; 0 if not even one row fits."""
    batch = start
    if not fits(batch):
        while batch > 1:
            batch //= 2
            if fits(batch):
                return batch
        return 0
    while batch * 2 <= cap and fits(batch * 2):
        batch *= 2
    return batch


def memory_limit() -> int | None:
    """The bytes XLA may allocate on the first device, None where it reports none (a CPU)."""
    stats = jax.devices()[0].memory_stats()
    return (stats or {}).get("bytes_limit")


def markdown(results: list[Result], device_kind: str, peak: float | None, limit: int | None) -> str:
    """The results as a Markdown table, under a line naming the device."""
    peak_text = f"{peak / 1e12:.0f} TFLOP/s bfloat16 peak" if peak else "peak unknown: no MFU"
    limit_text = f"{limit / 2**30:.1f} GiB memory limit" if limit else "no memory limit reported"
    decode = " | ".join(f"decode tokens/s, batch {b}" for b in DECODE_BATCHES)
    lines = [
        f"### Device check: {device_kind} ({jax.default_backend()}, {jax.device_count()} device(s), one used; "
        f"{peak_text}; {limit_text}; jax {jax.__version__})",
        "",
        "Random weights; bfloat16 compute, float32 parameters; train step = forward, backward, AdamW. "
        "Largest batch: rows of the same length whose compiled step fits the memory limit (searched by "
        "doubling, XLA's memory analysis).",
        "",
        f"| model | parameters | dtype, attention | batch x tokens | compile s | training tokens/s | MFU | {decode} "
        "| largest batch |",
        "|---|---|---|---|---|---|---|" + "---|" * len(DECODE_BATCHES) + "---|",
    ]
    for r in results:
        mfu = "—" if r.mfu is None else f"{100 * r.mfu:.1f}%"
        largest = "—" if r.largest_batch is None else str(r.largest_batch)
        decode = " | ".join(f"{r.decode_tokens_per_sec[b]:,.0f}" for b in DECODE_BATCHES)
        lines.append(f"| {r.name} | {r.params / 1e6:.1f}M | {r.execution} | {r.batch} x {r.seq_len} "
                     f"| {r.compile_seconds:.1f} | {r.tokens_per_sec:,.0f} | {mfu} | {decode} | {largest} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="1-layer stand-ins, seconds on a CPU (a smoke run)")
    args = parser.parse_args(argv)
    device_kind = jax.devices()[0].device_kind
    peak, limit = peak_flops(device_kind), memory_limit()
    print(f"device check on {device_kind} ({jax.default_backend()})", file=sys.stderr, flush=True)
    rounds = 2 if args.tiny else 3
    results = [measure(plan, peak, limit, rounds) for plan in plans(args.tiny)]
    print(markdown(results, device_kind, peak, limit))


if __name__ == "__main__":
    main()
