"""Where the time goes: one compiled step, profiled op by op.

    python bench/op_profile.py                                   # the baby-GPT train step (~1 minute)
    python bench/op_profile.py --config shakespeare              # the default model's train step
    python bench/op_profile.py --set scan_layers=True            # with a model field changed
    python bench/op_profile.py --decode --config gpt2 --batch 1  # one decode step of GPT-2 small

Runs the compiled step a few times under `jax.profiler.trace`, reads the trace back
(`jax.profiler.ProfileData`) and adds up the time of each compiled XLA op. Every op is named in the
HLO's metadata after the JAX operation it was made from (a fused kernel after its root operation):
the first table sums the time by that operation (dot_general, reduce_sum, transpose,
dynamic_slice, ...; a fused kernel that holds a matrix multiply counts as dot_general), the second lists the slowest single ops with their output shapes and where in
the model they come from. Decode steps use random weights, unrolled layers and a 64-slot cache
(--cache_len), as bench/decode.py does.

Op times are summed over XLA's worker threads: independent ops run side by side, so the sum can
exceed the wall time of the step, which is printed too. These machines are shared and noisy: read
shares, not milliseconds.
"""

from __future__ import annotations

import argparse
import ast
import collections
import os
import re
import tempfile
from collections.abc import Callable

import jax

from bench import timing
from bench.steps import GREEDY, decode_start, model_config, random_params
from bench.train import Ours
from configs import baby_gpt, gpt2, modern, modern_b32, shakespeare
from transformer import sampling
from transformer.model.config import ModelConfig
from transformer.model.param_tree import unrolled

CONFIGS = {"baby_gpt": baby_gpt, "shakespeare": shakespeare, "modern": modern, "modern_b32": modern_b32,
           "gpt2": gpt2}
# `%name = f32[4096,1536]{1,0} fusion(...), ..., metadata={op_name="jit(step)/.../dot_general" ...}`
HLO_OP = re.compile(r'^\s*(?:ROOT )?%([\w.-]+) = (\S+) ([\w-]+)\((.*)$', re.MULTILINE)
OP_NAME = re.compile(r'op_name="([^"]*)"')
CALLS = re.compile(r"calls=%([\w.-]+)")
COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.-]+) .*?\{\n(.*?)^\}", re.MULTILINE | re.DOTALL)


def hlo_ops(compiled_text: str) -> dict[str, tuple[str, str]]:
    """Compiled HLO text -> {op name: (output shape, JAX op_name path of what it computes)}.

    A fused kernel is named after its matrix multiply if it holds one (the elementwise work fused
    around a dot is small beside it), else after its root operation. Ops made by XLA itself, or
    named after an argument (e.g. a donated parameter's copy), get their HLO opcode instead.
    """
    bodies = {m.group(1): m.group(2) for m in COMPUTATION.finditer(compiled_text)}
    ops = {}
    for m in HLO_OP.finditer(compiled_text):
        name, shape, opcode, rest = m.groups()
        source = OP_NAME.search(rest)
        calls = CALLS.search(rest)
        if opcode == "fusion" and calls and calls.group(1) in bodies:
            dot = next((d for d in HLO_OP.finditer(bodies[calls.group(1)]) if d.group(3) == "dot"), None)
            source = OP_NAME.search(dot.group(4)) if dot else source
        path = source.group(1) if source and "/" in source.group(1) else opcode
        ops[name] = (shape.split("{")[0], path)
    return ops


def op_seconds(run: Callable[[], None], ops: dict[str, tuple[str, str]]) -> dict[str, float]:
    """Seconds each compiled op spent in one call of run(), summed over its executions."""
    seconds: dict[str, float] = collections.Counter()
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            run()
        (path,) = [os.path.join(d, f) for d, _, fs in os.walk(trace_dir) for f in fs if f.endswith(".xplane.pb")]
        profile = jax.profiler.ProfileData.from_file(path)
    for plane in profile.planes:
        for line in plane.lines:
            for event in line.events:
                if event.name in ops:  # XLA's ops; skips Python frames and executor bookkeeping
                    seconds[event.name] += event.duration_ns * 1e-9
    return seconds


def kind(op_name: str) -> str:
    """'jit(step)/transpose(jvp(Decoder))/layers_0/mlp/fc_in/dot_general' -> 'dot_general'."""
    return op_name.rsplit("/", 1)[-1]


def where(op_name: str) -> str:
    """The model path of an op, without the jit/transform wrappers and the op itself."""
    if "/" not in op_name:
        return "(no source in the HLO metadata)"
    parts = [p for p in op_name.split("/")[:-1] if "(" not in p and p not in ("Decoder", "while", "body")]
    pass_ = "backward" if "transpose(" in op_name else "forward"
    return f"{pass_} {'/'.join(parts)}".strip()


def train_step(config_name: str, overrides: dict) -> tuple[Callable[[int], None], str, str]:
    """(run(n) doing n train steps, compiled HLO text, a description)."""
    ours = Ours(CONFIGS[config_name].get_config(), **overrides)
    inputs, targets = (ours.put(x) for x in ours.batches[0])
    text = ours.train_step.lower(ours.state, inputs, targets).compile().as_text()
    cfg, t = ours.cfg, CONFIGS[config_name].get_config().train
    return ours.run, text, f"train step of {config_name} ({describe(cfg)}, batch {t.batch_size} x {t.seq_len})"


def decode_step(config_name: str, overrides: dict, batch: int, steps: int,
                cache_len: int) -> tuple[Callable[[int], None], str, str]:
    """(run(steps) doing that many greedy decode steps in one scan, compiled HLO text, a description)."""
    cfg = model_config(CONFIGS[config_name].get_config().model, **overrides)
    params = random_params(cfg)
    state = decode_start(cfg, params, batch, prompt_len=16, cache_len=cache_len)
    params, cfg = unrolled(params, cfg)

    def run(steps: int) -> None:
        jax.block_until_ready(sampling.decode(params, cfg, state, steps, GREEDY))

    text = sampling.decode.lower(params, cfg, state, steps, GREEDY).compile().as_text()
    return run, text, f"decode step of {config_name} ({describe(cfg)}, batch {batch}, {cache_len} cache slots)"


def describe(cfg: ModelConfig) -> str:
    return (f"L {cfg.num_layers}, d {cfg.d_model}, attention {cfg.attention_impl}, scan {cfg.scan_layers}, "
            f"{cfg.dtype}")


def parse_overrides(items: list[str]) -> dict:
    """['scan_layers=True', 'dtype=bfloat16'] -> {'scan_layers': True, 'dtype': 'bfloat16'}."""
    out = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"--set takes field=value (a ModelConfig field), got {item!r}")
        name, value = item.split("=", 1)
        try:
            out[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[name] = value  # a plain string such as bfloat16
    return out


def markdown(seconds: dict[str, float], ops: dict[str, tuple[str, str]], steps: int, wall: float,
             title: str, top: int) -> str:
    total = sum(seconds.values())
    by_kind: dict[str, float] = collections.Counter()
    count: dict[str, int] = collections.Counter()
    for name, s in seconds.items():
        by_kind[kind(ops[name][1])] += s
        count[kind(ops[name][1])] += 1
    ms = lambda s: f"{1e3 * s / steps:,.1f}"  # noqa: E731  per step
    lines = [
        f"### Where the time goes: {title}",
        "",
        f"Wall time {ms(wall)} ms/step; the ops' times add up to {ms(total)} ms/step (ops run side by "
        "side on the worker threads). An op is counted under the JAX operation it was made from (a "
        "fused kernel: its matrix multiply if it holds one, else its root operation).",
        "",
        "| operation | ms/step | share of op time | compiled ops |",
        "|---|---|---|---|",
    ]
    lines += [f"| {k} | {ms(s)} | {s / total:.1%} | {count[k]} |" for k, s in by_kind.most_common(top)]
    lines += ["", f"Slowest {top} single ops:", "", "| op | output | from | ms/step | share |", "|---|---|---|---|---|"]
    for name, s in collections.Counter(seconds).most_common(top):
        shape, op_name = ops[name]
        lines.append(f"| {kind(op_name)} | {shape} | {where(op_name)} | {ms(s)} | {s / total:.1%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="baby_gpt", choices=sorted(CONFIGS))
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="change a model field, e.g. --set scan_layers=True (repeatable)")
    parser.add_argument("--decode", action="store_true", help="profile a decode step, not a train step")
    parser.add_argument("--batch", type=int, default=1, help="decode batch size (default 1)")
    parser.add_argument("--cache_len", type=int, default=64, help="decode cache slots (default 64)")
    parser.add_argument("--steps", type=int, default=None, help="steps traced (default: 2 train, 16 decode)")
    parser.add_argument("--top", type=int, default=12, help="rows per table (default 12)")
    args = parser.parse_args()
    overrides = parse_overrides(args.set)
    try:  # a bad --set names the field here, before anything compiles
        model_config(CONFIGS[args.config].get_config().model, **overrides)
    except (ValueError, TypeError) as e:
        raise SystemExit(f"--set: {e}") from None
    steps = args.steps or (16 if args.decode else 2)
    if args.decode:
        run, text, title = decode_step(args.config, overrides, args.batch, steps, args.cache_len)
    else:
        run, text, title = train_step(args.config, overrides)
    wall = timing.best(lambda: run(steps), repeats=1)  # after a call that compiles and warms up
    ops = hlo_ops(text)
    seconds = op_seconds(lambda: run(steps), ops)
    if not seconds:
        raise SystemExit("the trace held no XLA ops: is this jax's CPU/GPU runtime with profiling enabled?")
    print(markdown(seconds, ops, steps, wall, title, args.top))


if __name__ == "__main__":
    main()
