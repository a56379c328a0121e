"""Decode time and KV-cache memory against generated length: a full cache against ring buffers.

    python bench/window_decode.py            # n up to 8x the context
    python bench/window_decode.py --quick    # n up to 4x, fewer rounds

configs/modern.py's model (RoPE, context C = 128), random weights, float32 on the CPU, greedy, batch
8, a 16-token prompt, decoded to n = C, 2C, 4C, 8C tokens in three forms with the same weights:

- full     the plain model with its context stretched to n (RoPE has no position table): a cache of
           n slots per layer, growing with n;
- window   attention_window = C in every layer: each layer a ring of C slots (a different model:
           it attends to the last C tokens only);
- rolling  the plain model past its context, generate's `sinks=4` (StreamingLLM): every layer a
           ring of C slots whose first 4 keep the first tokens.

For each n: ms per decode step, timed over 96 steps that end at n (the cache then holds n tokens;
the fastest of a few rounds, the three forms interleaved round by round), the cache's bytes (every
array of the pytree, measured), and the rolling step's time over the window's. These machines are
shared and noisy: compare ratios from one run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import jax
import numpy as np

from bench import timing
from bench.steps import GREEDY, model_config, random_params
from configs import modern
from transformer import sampling
from transformer.model import kv_cache
from transformer.model.param_tree import unrolled

BATCH, PROMPT_LEN, TIMED = 8, 16, 96


def start(cfg, params, cache_len: int, sinks: int | None):
    """The decode state after the prefill of one random prompt."""
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (BATCH, PROMPT_LEN), dtype=np.int32)
    keys = sampling.row_keys(jax.random.key(0), BATCH)
    return sampling.prefill(params, cfg, tokens, np.full(BATCH, PROMPT_LEN, np.int32), keys, cache_len, GREEDY,
                            sinks=sinks)


def prepare(cfg, params, n: int, sinks: int | None) -> tuple[Callable[[], float], int]:
    """(a timer of ms per decode step over the TIMED steps ending at n, cache bytes) for one form,
    compiled here."""
    cache_len = n if sinks is None else cfg.max_seq_len
    state = start(cfg, params, cache_len, sinks)
    flat, flat_cfg = unrolled(params, cfg)
    fill = n - PROMPT_LEN - TIMED  # untimed steps that bring the cache to n - TIMED tokens
    state, _, _ = sampling.decode(flat, flat_cfg, state, fill, GREEDY)
    run = lambda: sampling.decode(flat, flat_cfg, state, TIMED, GREEDY)  # noqa: E731
    timing.timed(run)  # compile
    return lambda: 1e3 * timing.seconds(run) / TIMED, kv_cache.measured_bytes(state.cache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="n up to 4x the context, 3 rounds")
    args = parser.parse_args()
    base = model_config(modern.get_config().model, dropout=0.0)
    context = base.max_seq_len
    params = random_params(base)  # RoPE: the same parameters serve every context and window
    lengths = [context * k for k in ((1, 2, 4) if args.quick else (1, 2, 4, 8))]
    rounds = 3 if args.quick else 9
    print(f"configs/modern.py: d_model {base.d_model}, {base.num_layers} layers, context C = {context}; "
          f"batch {BATCH}, {jax.default_backend()}, float32\n")
    print("| n (tokens) | full: ms/step | full: cache bytes | window C: ms/step | window C: cache bytes "
          "| rolling, 4 sinks: ms/step | rolling: cache bytes | rolling / window |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in lengths:
        forms = {"full": prepare(base.replace(max_seq_len=n), params, n, None),
                 "window": prepare(base.replace(max_seq_len=n, attention_window=context), params, n, None),
                 "rolling": prepare(base, params, n, 4)}
        # Interleaved rounds: a busy moment of the shared machine falls on every form alike.
        ms = timing.alternate({name: timer for name, (timer, _) in forms.items()}, rounds)
        print(f"| {n} | " + " | ".join(f"{ms[name]:.3f} | {size:,}" for name, (_, size) in forms.items())
              + f" | {ms['rolling'] / ms['window']:.2f}x |", flush=True)

if __name__ == "__main__":
    main()
