"""Decoding with the few-row products weight-major, against the plain product (issue 50).

    python bench/few_rows.py     # ~1 minute

GPT-2 small's architecture (configs/gpt2.py), random weights, float32 on the CPU, a greedy decode
scan of 32 steps after a 16-token prompt, at batch 1, 8 and 32, compiled twice: with
`transformer.model.linear.FEW_ROWS` as committed (products of 2..FEW_ROWS rows computed as
(W x^T)^T) and with it set to 0 (every product plain, x W^T). The two programs alternate, round by
round; each side's fastest. Prints a Markdown table; compare ratios within one run.
"""

from __future__ import annotations

import jax

from bench import timing
from bench.decode import PROMPT_LEN
from bench.steps import GREEDY, decode_start, model_config, random_params
from configs import gpt2
from transformer import sampling
from transformer.model import linear
from transformer.model.param_tree import unrolled

STEPS, ROUNDS = 32, 5


def compiled_decode(cfg, params, state, few_rows: int):
    """The decode scan compiled with linear.FEW_ROWS = few_rows (read when the model is traced)."""
    committed, linear.FEW_ROWS = linear.FEW_ROWS, few_rows
    jax.clear_caches()  # else lowering reuses the trace made under the other value
    try:
        return sampling.decode.lower(params, cfg, state, STEPS, GREEDY).compile()
    finally:
        linear.FEW_ROWS = committed


def main() -> None:
    cfg = model_config(gpt2.get_config().model)
    params = random_params(cfg)
    print(f"GPT-2 small, {jax.default_backend()}, float32; ms per decode step, the fastest of {ROUNDS} rounds\n")
    print("| batch | plain x W^T: ms/step | weight-major: ms/step | plain / weight-major |")
    print("| ---: | ---: | ---: | ---: |")
    for batch in (1, 8, 32):
        state = decode_start(cfg, params, batch, PROMPT_LEN, sampling.bucket(PROMPT_LEN + STEPS, cfg.max_seq_len))
        flat, flat_cfg = unrolled(params, cfg)
        programs = {"plain": compiled_decode(flat_cfg, flat, state, 0),
                    "weight_major": compiled_decode(flat_cfg, flat, state, linear.FEW_ROWS)}
        timers = {}
        for name, program in programs.items():
            run = lambda program=program: program(flat, state)  # noqa: E731
            timing.timed(run)  # the first touch of memory
            timers[name] = lambda run=run: timing.seconds(run) / STEPS
        ms = {name: 1e3 * s for name, s in timing.alternate(timers, ROUNDS).items()}
        print(f"| {batch} | {ms['plain']:.2f} | {ms['weight_major']:.2f} | {ms['plain'] / ms['weight_major']:.2f}x |",
              flush=True)


if __name__ == "__main__":
    main()
