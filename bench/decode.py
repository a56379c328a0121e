"""Decode speed of KV-cached generation, against a cache-free loop, Hugging Face and the memory floor.

    python bench/decode.py            # ~3-5 minutes on 2 cores (longer when the machine is busy)
    python bench/decode.py --quick    # fewer tokens and rounds, ~2 minutes

For the default model (configs/shakespeare.py) and GPT-2 small's architecture (configs/gpt2.py),
both with random weights, float32 on the CPU, greedy decoding:

- tokens/s of `sampling.decode` (the lax.scan loop) at batch 1 and 8, after a 16-token prompt;
- the same architecture as a Hugging Face `GPT2LMHeadModel`, `generate` with its KV cache, in PyTorch
  (in a child process of the same run; one thread per core, or one thread if that is faster);
- the weight-reading floor: at batch 1 every step reads every parameter once, so a step cannot take
  less than parameter bytes / memory bandwidth (the bandwidth is measured here, in this run);
- ms per token as the cache fills (positions 16, 128, 240 of a 256-slot cache), and a cache-free
  loop that re-runs the full forward over the last 128 tokens for each new token.

Prints Markdown tables. These machines are shared and noisy: compare ratios from one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import multiprocessing
import os
import sys
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from importlib.metadata import version

import jax
import jax.numpy as jnp

from bench import timing
from bench.steps import GREEDY, decode_start, model_config, random_params, torch_gpt2
from configs import gpt2, shakespeare
from transformer import sampling
from transformer.model.config import ModelConfig
from transformer.model.decoder import Decoder, count_params
from transformer.model.param_tree import unrolled

PROMPT_LEN = 16
LATENCY_POSITIONS = (16, 128, 240)
LATENCY_CACHE = 256  # slots of the cache the latency is measured in
RECOMPUTE_CONTEXT = 128  # tokens the cache-free loop re-reads per new token
GiB = 2**30


def ours_timer(cfg: ModelConfig, params: dict, state, steps: int) -> Callable[[], float]:
    """A timer of one `steps`-long decode scan from `state`, in seconds per step (compiled here).

    The layers are unrolled first, once, as `generate` does (see `sampling.decode`).
    """
    params, cfg = unrolled(params, cfg)
    run = lambda: sampling.decode(params, cfg, state, steps, GREEDY)  # noqa: E731
    timing.timed(run)  # compile
    return lambda: timing.seconds(run) / steps


def recompute_timer(cfg: ModelConfig, params: dict, steps: int) -> Callable[[], float]:
    """A timer of cache-free greedy decoding, in seconds per token: each new token re-runs the full
    forward over the last 128 tokens."""

    @jax.jit
    def step(params: dict, window: jax.Array) -> jax.Array:  # [1, 128] -> shifted by one new token
        # params is an argument, not a closure: closed-over weights would be compile-time constants
        # (XLA constant-folds their transposes, seconds of compile and not how a model runs).
        logits, _ = Decoder(cfg).apply({"params": params}, window)
        return jnp.concatenate([window[:, 1:], jnp.argmax(logits[:, -1], axis=-1)[:, None]], axis=1)

    def loop() -> None:
        window = jnp.zeros((1, RECOMPUTE_CONTEXT), jnp.int32)
        for _ in range(steps):
            window = step(params, window)
        jax.block_until_ready(window)

    loop()  # compile
    return lambda: timing.seconds(loop) / steps


@functools.cache
def hf_model(cfg: ModelConfig):
    """This architecture as a Hugging Face GPT2LMHeadModel with random weights (float32, eval mode)."""
    return torch_gpt2(cfg).eval()


def hf_seconds_per_step(cfg: ModelConfig, batch: int, steps: int, threads: int) -> float:
    """Seconds per decode step of Hugging Face `generate` (greedy, with its KV cache) on `threads` threads.

    generate includes the prefill, so the step time is (time for 1 + steps tokens - time for 1) / steps.
    """
    import torch

    torch.set_num_threads(threads)
    model = hf_model(cfg)
    prompt = torch.randint(0, cfg.vocab_size, (batch, PROMPT_LEN), generator=torch.Generator().manual_seed(0))

    def generate(new_tokens: int) -> None:
        with torch.inference_mode():
            model.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                min_new_tokens=new_tokens, do_sample=False, use_cache=True, pad_token_id=0,
            )

    generate(2)  # warm up
    return (timing.seconds(lambda: generate(1 + steps)) - timing.seconds(lambda: generate(1))) / steps


def hf_timer(
    torch_process: Executor, cfg: ModelConfig, batch: int, steps: int, threads: int
) -> Callable[[], float]:
    """A timer of Hugging Face decoding in the PyTorch process, in seconds per step."""
    return lambda: torch_process.submit(hf_seconds_per_step, cfg, batch, steps, threads).result()


def faster_torch_threads(torch_process: Executor, cfg: ModelConfig, batch: int) -> int:
    """One thread per core, or one thread if that decodes faster (from a short trial of each).

    When other processes load the machine, PyTorch's OpenMP threads wait on each other, and one
    thread can be several times faster: the comparison should not handicap PyTorch for that.
    """
    trial = {t: hf_timer(torch_process, cfg, batch, 4, t)() for t in {os.cpu_count() or 1, 1}}
    return min(trial, key=trial.get)


@dataclasses.dataclass
class Throughput:
    """Seconds per decode step of one architecture at one batch size."""

    batch: int
    cache_len: int
    ours: float
    hf: float
    hf_threads: int


@dataclasses.dataclass
class ModelResult:
    name: str
    weight_bytes: int
    throughput: list[Throughput]
    latency: dict[int, float]  # cache position -> seconds per token, batch 1
    recompute: float  # seconds per token of the cache-free loop, batch 1


def bench_model(name: str, cfg: ModelConfig, steps: int, rounds: int, torch_process: Executor) -> ModelResult:
    """Every measurement of one architecture.

    PyTorch runs in its own process: in one process with XLA, the two thread pools slow each other.
    """
    params = random_params(cfg)
    throughput = []
    for batch in (1, 8):
        cache_len = sampling.bucket(PROMPT_LEN + steps, cfg.max_seq_len)  # what generate would use
        state = decode_start(cfg, params, batch, PROMPT_LEN, cache_len)
        hf_threads = faster_torch_threads(torch_process, cfg, batch)
        timers = {"ours": ours_timer(cfg, params, state, steps)}
        timers["hf"] = hf_timer(torch_process, cfg, batch, steps, hf_threads)
        best = timing.alternate(timers, rounds)
        throughput.append(Throughput(batch, cache_len, best["ours"], best["hf"], hf_threads))
        print(f"{name}: {throughput[-1]}", file=sys.stderr)  # progress; the tables come at the end

    # Latency: one prefill fills a 256-slot cache, then the decode starts at each position in turn
    # (the slots below it count as filled), so every position runs the same compiled scan.
    state = decode_start(cfg, params, 1, max(LATENCY_POSITIONS), LATENCY_CACHE)
    at = lambda p: state.replace(positions=jnp.full((1,), p, jnp.int32))  # noqa: E731
    timers = {p: ours_timer(cfg, params, at(p), steps=8) for p in LATENCY_POSITIONS}
    timers["recompute"] = recompute_timer(cfg, params, steps=3)
    best = timing.alternate(timers, rounds)
    return ModelResult(
        name=name,
        weight_bytes=4 * count_params(params),
        throughput=throughput,
        latency={p: best[p] for p in LATENCY_POSITIONS},
        recompute=best["recompute"],
    )


def markdown(results: list[ModelResult], bandwidth: float, steps: int) -> str:
    """The two result tables, with the run's setting."""
    lines = [
        f"## Decode speed ({os.cpu_count()} cores, jax {jax.__version__}, torch {version('torch')}, "
        f"transformers {version('transformers')}; float32, greedy, {steps} new tokens after a "
        f"{PROMPT_LEN}-token prompt, random weights)",
        "",
        f"Memory read bandwidth, measured in this run: {bandwidth / 1e9:.1f} GB/s. Floor: the time to read "
        "every weight once from memory, a lower bound on a batch-1 step for weights larger than the CPU "
        "caches (a model of a few MB can sit in cache and beat it). Each figure is the fastest of "
        "interleaved rounds.",
        "",
        "| model | weights | batch | cache slots | ours tok/s | ours ms/step | HF tok/s "
        "| HF ms/step (threads) | ours / HF speed | floor ms/step | ours / floor time |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        floor = r.weight_bytes / bandwidth
        for t in r.throughput:
            lines.append(
                f"| {r.name} | {r.weight_bytes / 1e6:.0f} MB | {t.batch} | {t.cache_len} "
                f"| {t.batch / t.ours:,.0f} | {1e3 * t.ours:.2f} | {t.batch / t.hf:,.0f} "
                f"| {1e3 * t.hf:.2f} ({t.hf_threads}) | {t.hf / t.ours:.2f}x | {1e3 * floor:.2f} "
                f"| {t.ours / floor:.2f}x |"
            )
    positions = " | ".join(f"ms/token @ {p}" for p in LATENCY_POSITIONS)
    lines += [
        "",
        f"### Latency as the cache fills (batch 1, {LATENCY_CACHE}-slot cache) and cache-free recompute",
        "",
        f"| model | {positions} | recompute ms/token ({RECOMPUTE_CONTEXT} tokens) | recompute / cached |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        cells = " | ".join(f"{1e3 * r.latency[p]:.2f}" for p in LATENCY_POSITIONS)
        ratio = r.recompute / r.latency[RECOMPUTE_CONTEXT]
        lines.append(f"| {r.name} | {cells} | {1e3 * r.recompute:.2f} | {ratio:.1f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer tokens and rounds (a smoke run)")
    args = parser.parse_args()
    steps, rounds = (8, 2) if args.quick else (32, 3)

    bandwidth = GiB / timing.read_seconds(GiB, repeats=3)  # bytes/s
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter: no XLA threads in it
    models = {"shakespeare": shakespeare.get_config().model, "gpt2 (124M)": gpt2.get_config().model}
    # The latency probe reads positions up to 240: the random-weight models get at least that context.
    cfgs = {name: model_config(model, max_seq_len=max(model.max_seq_len, 256)) for name, model in models.items()}
    with ProcessPoolExecutor(1, mp_context=spawn) as torch_process:
        results = [bench_model(name, cfg, steps, rounds, torch_process) for name, cfg in cfgs.items()]
    print(markdown(results, bandwidth, steps))


if __name__ == "__main__":
    main()
