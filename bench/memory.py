"""Peak memory of one GPT-2-small train step, from XLA's buffer assignment, with and without remat.

    python bench/memory.py            # scanned and unrolled layers, ~2-4 minutes on 2 cores
    python bench/memory.py --quick    # scanned layers only

GPT-2 small (configs/gpt2.py: 124M parameters, batch 8 x 1024, float32). The train step
(transformer.training.make_train_step: forward, backward, AdamW, the state donated) is compiled
from abstract inputs (jax.eval_shape / ShapeDtypeStruct), so nothing of 124M parameters is
allocated and no step runs. `compiled.memory_analysis()` gives the sizes XLA assigned:

- argument: the inputs (state: params + AdamW moments; the batch);
- output: the new state and the metrics;
- alias: output bytes that reuse donated argument buffers (the state is donated);
- temp: everything else live during the step (activations kept for the backward pass, gradients,
  workspace), at its peak.

peak = argument + output - alias + temp. With remat (ModelConfig.remat) each layer keeps only its
input for the backward pass and recomputes the rest, trading compute for activation memory.
"""

from __future__ import annotations

import argparse
import sys

from bench import timing
from bench.steps import train_setup
from configs import gpt2

GiB = 2**30


def step_memory(config, **model_overrides) -> dict[str, float]:
    """Byte sizes from XLA's memory analysis of the compiled train step (never run)."""
    run = train_setup(config, abstract=True, **model_overrides)
    compiled, seconds = timing.timed(lambda: run.lower().compile())
    sizes = memory_sizes(compiled)
    sizes["params"] = run.num_params
    sizes["compile_s"] = seconds
    return sizes


def memory_sizes(compiled) -> dict[str, int]:
    """{argument, output, alias, temp, peak} bytes of a compiled step, from XLA's memory analysis."""
    stats = compiled.memory_analysis()
    sizes = {
        "argument": stats.argument_size_in_bytes,
        "output": stats.output_size_in_bytes,
        "alias": stats.alias_size_in_bytes,
        "temp": stats.temp_size_in_bytes,
    }
    sizes["peak"] = sizes["argument"] + sizes["output"] - sizes["alias"] + sizes["temp"]
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="scanned layers only")
    args = parser.parse_args()
    config = gpt2.get_config()
    loops = (True,) if args.quick else (True, False)

    rows = []
    results = {}
    for scan in loops:
        for remat in (False, True):
            m = step_memory(config, scan_layers=scan, remat=remat)
            results[scan, remat] = m
            print(f"  scan {scan}, remat {remat}: peak {m['peak'] / GiB:.2f} GiB "
                  f"(compiled in {m['compile_s']:.0f} s)", file=sys.stderr)
            rows.append(
                f"| {'nn.scan' if scan else 'Python loop'} | {'yes' if remat else 'no'} | "
                f"{m['argument'] / GiB:.2f} | {m['output'] / GiB:.2f} | {m['alias'] / GiB:.2f} | "
                f"{m['temp'] / GiB:.2f} | **{m['peak'] / GiB:.2f}** |"
            )

    t = config.train
    params = results[loops[0], False]["params"]
    print(f"### Peak memory of one train step: GPT-2 small ({params / 1e6:.0f}M parameters), batch "
          f"{t.batch_size} x {t.seq_len}, float32\n")
    print("From XLA's memory analysis of the compiled step (compiled from abstract inputs, never run). "
          "GiB; peak = argument + output - alias + temp (the donated state's buffers are reused for the "
          f"new state). Parameters + AdamW moments alone are {3 * 4 * params / GiB:.2f} GiB.\n")
    print("| layers | remat | argument | output | alias (donated) | temp | peak |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    for scan in loops:
        saved = results[scan, False]["temp"] - results[scan, True]["temp"]
        ratio = results[scan, True]["peak"] / results[scan, False]["peak"]
        print(f"\n{'nn.scan' if scan else 'Python loop'}: remat cuts the temporary memory by "
              f"{saved / GiB:.2f} GiB ({ratio:.2f}x the peak).")
        if not scan and saved < 0.01 * results[scan, False]["temp"]:
            print("JAX does save fewer residuals under remat here, but with "
                  "the layers unrolled XLA:CPU compiles the step to the same temporaries (it merges or "
                  "hoists the recomputation): remat needs nn.scan (scan_layers=True) to save memory.")


if __name__ == "__main__":
    main()
