"""Peak memory of one train step, from XLA's buffer assignment: GPT-2 small with and without remat,
and per device on meshes of 8 (simulated) devices for GPT-2 small and a ~1B Llama-shaped model.

    python bench/memory.py            # scanned and unrolled layers, then the meshes; ~10 minutes on 2 cores
    python bench/memory.py --quick    # scanned layers only, then the meshes
    python bench/memory.py --meshes   # the per-device table only

GPT-2 small (configs/gpt2.py: 124M parameters, batch 8 x 1024, float32). The train step
(transformer.training.steps.make_train_step: forward, backward, AdamW, the state donated) is compiled
from abstract inputs (jax.eval_shape / ShapeDtypeStruct), so nothing of 124M parameters is
allocated and no step runs. `compiled.memory_analysis()` gives the sizes XLA assigned:

- argument: the inputs (state: params + AdamW moments; the batch);
- output: the new state and the metrics;
- alias: output bytes that reuse donated argument buffers (the state is donated);
- temp: everything else live during the step (activations kept for the backward pass, gradients,
  workspace), at its peak.

peak = argument + output - alias + temp. With remat (ModelConfig.remat) each layer keeps only its
input for the backward pass and recomputes the rest, trading compute for activation memory.

On a mesh the step is compiled for 8 CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8,
set here before JAX loads when run as a script) and the analysis gives one device's bytes: the state as the default
rules split it (transformer/training/sharding.py), its share of the activations, and the collectives' buffers.
"""

from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__":  # only as a script: an importer (bench/accelerator.py, its test) keeps its
    # own devices, and the subprocesses it starts later must not inherit 8 simulated ones
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402

from bench import timing  # noqa: E402
from bench.steps import train_setup  # noqa: E402
from configs import gpt2  # noqa: E402
from transformer.training.sharding import make_mesh  # noqa: E402

GiB = 2**30


# A ~1B-parameter Llama-shaped model (Llama-2's widths at 20 layers; GQA with 8 key/value heads).
LLAMA_1B = dict(vocab_size=32000, max_seq_len=1024, d_model=2048, num_layers=20, num_heads=32, num_kv_heads=8,
                mlp_dim=5632, activation="swiglu", position="rope", norm="rmsnorm", norm_bias=False,
                use_bias=False, tie_embeddings=False)
# (data, fsdp, tensor). GPT-2's 12 heads do not divide by 8: its tensor-parallel meshes use 4.
MESHES = {
    "gpt2": {"1": None, "fsdp 1x8x1": (1, 8, 1), "tensor 2x1x4": (2, 1, 4), "mixed 1x2x4": (1, 2, 4)},
    "llama_1b": {"1": None, "fsdp 1x8x1": (1, 8, 1), "tensor 1x1x8": (1, 1, 8), "mixed 2x2x2": (2, 2, 2)},
}


def step_memory(config, mesh=None, **model_overrides) -> dict[str, float]:
    """Byte sizes (one device's) from XLA's memory analysis of the compiled train step (never run)."""
    run = train_setup(config, abstract=True, mesh=mesh, **model_overrides)
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


def mesh_configs() -> dict:
    """GPT-2 small with its vocabulary padded to 50304 (= 8 x 6288, so it splits over tensor devices,
    as nanoGPT pads it), and the ~1B Llama; both batch 8 x 1024, float32, scanned layers."""
    gpt = gpt2.get_config()
    gpt.model.vocab_size = 50304
    llama = gpt2.get_config()  # the same training fields; the model replaced
    for k, v in LLAMA_1B.items():
        llama.model[k] = v
    return {"gpt2": gpt, "llama_1b": llama}


def mesh_table() -> None:
    """Per-device memory of one train step on 1 device and on 8-device meshes."""
    rows = []
    for name, config in mesh_configs().items():
        base = None
        for label, shape in MESHES[name].items():
            cpus = jax.devices("cpu")  # the 8 simulated devices, whatever the default backend
            mesh = make_mesh(devices=cpus[:1]) if shape is None else make_mesh(*shape, devices=cpus)
            m = step_memory(config, mesh)
            base = base or m
            state = m["argument"]  # params + AdamW moments (+ the batch, a few KiB)
            print(f"  {name} {label}: peak {m['peak'] / GiB:.2f} GiB (compiled in {m['compile_s']:.0f} s)",
                  file=sys.stderr)
            rows.append(
                f"| {name} ({m['params'] / 1e6:.0f}M) | {label} | {state / GiB:.3f} | {state / base['argument']:.3f} | "
                f"{m['temp'] / GiB:.2f} | {m['temp'] / base['temp']:.3f} | **{m['peak'] / GiB:.2f}** | "
                f"{m['peak'] / base['peak']:.3f} |"
            )
    print("### Per-device memory of one train step on 8 devices (mesh data x fsdp x tensor)\n")
    print("Batch 8 x 1024, float32, scanned layers, no remat; from XLA's memory analysis of the step compiled "
          "for 8 simulated CPU devices (never run). GiB per device; `x 1 device` is the ratio to the 1-device "
          "step (1/8 = 0.125). State = the step's arguments: params + AdamW moments (+ the batch). GPT-2's "
          "vocabulary is padded to 50304 so it splits by 8.\n")
    print("| model | mesh | state | x 1 device | temp | x 1 device | peak | x 1 device |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\nWhat does not fall to 1/8, and why (the rules of transformer/training/sharding.py): the state is split over "
          "fsdp x tensor and replicated over data, so a mesh with a data axis of 2 holds 1/4 of it per device. "
          "The activations are split over the batch by data x fsdp and, inside attention and the MLP, over "
          "heads and hidden width by tensor; the residual stream [B, T, D] (norms, residual adds, the "
          "layers' saved inputs) is whole on every tensor device, so tensor parallelism alone leaves "
          "those activations unsplit (Megatron's sequence parallelism would split them over the "
          "positions; not done here). FSDP adds one layer's gathered weights to the temporaries.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="scanned layers only")
    parser.add_argument("--meshes", action="store_true", help="only the per-device table on 8 devices")
    args = parser.parse_args()
    if args.meshes:
        return mesh_table()
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
    print()
    mesh_table()


if __name__ == "__main__":
    main()
