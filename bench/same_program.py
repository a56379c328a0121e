"""Is the compiled forward pass and training gradient of a checkout the same program as another's?

    python bench/same_program.py --against /tmp/old     # e.g. `git worktree add /tmp/old <commit>`

Compiles, for configs/modern.py's model and the default run's (configs/shakespeare.py: layer norm, learned
positions, GELU) at their training shapes (and each with scanned layers), the forward pass and the gradient
of a loss under jax.jit in each checkout, in its own
process, and compares XLA's optimised HLO with the source locations (file names, lines, stack
frames) stripped: equal text is the same program, so the same speed, with nothing to time. This is
how a change to the model's code that must cost nothing (a named point, an edit that is not asked
for) is checked against the commit before it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run inside each checkout: prints the two programs per layout, source locations stripped.
PROGRAMS = r"""
import re, sys
import jax, jax.numpy as jnp
from configs import modern, shakespeare
from transformer import ModelConfig
from transformer.model.decoder import Decoder
from transformer.model.execution import resolve_auto

for config, scan in [(c, s) for c in (modern.get_config(), shakespeare.get_config()) for s in (False, True)]:
    cfg = resolve_auto(ModelConfig(**config.model.to_dict()), "cpu").cfg.replace(scan_layers=scan)
    x = jnp.zeros((config.train.batch_size, cfg.max_seq_len), jnp.int32)
    params = jax.eval_shape(lambda: Decoder(cfg).init(jax.random.key(0), x))["params"]
    forward = lambda p, x: Decoder(cfg).apply({"params": p}, x)[0]
    grad = jax.grad(lambda p, x: jax.nn.log_softmax(forward(p, x)).mean())
    for f in (forward, grad):
        text = jax.jit(f).lower(params, x).compile().as_text()
        text = re.sub(r", metadata=\{[^}]*\}", "", text)  # op names and source lines
        text = re.sub(r", stack_frame_id=\d+", "", text)
        lines = [l for l in text.splitlines() if not re.match(r'^\s*\d+ (\{file_name_id|{file_location_id|")', l)]
        print("\n".join(lines))
        print("=====")
"""


def programs(checkout: str) -> list[str]:
    """The programs of `checkout` (per config: forward and gradient, unscanned then scanned), as text."""
    out = subprocess.run([sys.executable, "-c", PROGRAMS], cwd=checkout, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": checkout, "JAX_PLATFORMS": "cpu"})
    if out.returncode:
        raise SystemExit(f"compiling in {checkout} failed:\n{out.stderr[-2000:]}")
    return out.stdout.split("=====\n")[:-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="another checkout (e.g. a git worktree of an older commit)")
    parser.add_argument("--checkout", default=ROOT, help="this checkout (default: the repository of this script)")
    args = parser.parse_args()
    names = [f"{config}: {f}{layout}" for config in ("modern", "shakespeare") for layout in ("", ", scan_layers")
             for f in ("forward", "gradient")]
    ours, theirs = programs(args.checkout), programs(args.against)
    for name, a, b in zip(names, ours, theirs):
        print(f"{name}: {'the same program' if a == b else 'DIFFERENT'} ({len(a.splitlines())} lines of HLO)")
    if ours != theirs:
        sys.exit(1)


if __name__ == "__main__":
    main()
