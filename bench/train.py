"""Training speed: tokens/s and model FLOP utilisation, against PyTorch and a measured matmul peak.

    python bench/train.py            # ~4-5 minutes on 2 idle cores
    python bench/train.py --quick    # fewer rounds, ~2-3 minutes

For the lecture GPT (configs/shakespeare.py) and nanoGPT's baby GPT (configs/baby_gpt.py), float32
on the CPU, random tokens at each config's batch size and sequence length:

- tokens/s of our jitted train step (transformer.training.steps.make_train_step: forward, cross-entropy,
  backward, global-norm clipping, masked AdamW; the state donated), driven as train.py drives it;
- the same architecture as a Hugging Face `GPT2LMHeadModel` (PyTorch eager, float32, its default
  attention, exact GELU, dropout 0, tied embeddings), same batch, `torch.optim.AdamW` with the same
  weight-decay groups and gradient clipping, one thread per core;
- model FLOP utilisation: tokens/s x FLOPs per token / peak, with FLOPs per token = 6N + 12 L T d
  (transformer.training.steps.flops_per_token; N without the position table) and the peak the best float32
  2048 x 2048 matmul of JAX and PyTorch, sampled between the rounds of the same comparison.

Ours and theirs run in alternating rounds (ours, theirs, ours, ...) so the noise of this shared
machine hits both alike; each side's fastest round is reported. A second table compares our own
variants (attention implementation, nn.scan over layers) on the baby GPT the same way, and a third
the step time of each piece of the default recipe (configs/modern.py, which PyTorch's GPT-2 cannot
express) added alone to the lecture GPT, then of the whole recipe. A fourth
splits our step into forward, backward and optimizer, and times a program doing only the step's
matrix multiplies (same shapes): the MFU this machine allows at these shapes if all else were free,
and how they compare with PyTorch's whole step. A fifth times one 2048 x 2048 matmul per library in
float32 and bfloat16 (what each library's kernels make of this CPU). Compare ratios from one run.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from bench import timing
from bench.steps import model_config, torch_adamw, torch_gpt2, torch_train_step, train_setup
from configs import baby_gpt, modern_b32, shakespeare
from transformer.model.config import ModelConfig
from transformer.training.loss import loss_fn

CONFIGS = {"shakespeare": shakespeare, "baby_gpt": baby_gpt}


# --- the peak --------------------------------------------------------------------------------


class MatmulPeak:
    """The matmul peak: the best n x n @ n x n matmul (float32 unless told), jitted in JAX and in PyTorch.

    Sampled in every round of every comparison (see `alternate`), so that each table's MFU is
    against the peak measured under the same machine load as the steps it divides.
    """

    def __init__(self, n: int = 2048, dtype: str = "float32"):
        import torch

        rng = np.random.default_rng(0)
        a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
        matmul = jax.jit(jnp.matmul)
        ja, jb = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
        ta, tb = (torch.from_numpy(x).to(getattr(torch, dtype)) for x in (a, b))
        self.calls = {"jax": lambda: matmul(ja, jb), "torch": lambda: torch.mm(ta, tb)}
        for call in self.calls.values():
            timing.timed(call)  # compile, warm up
        self.flops = 2 * n**3

    def timers(self) -> dict[str, Callable[[], float]]:
        """One timer per library: the seconds of one matmul."""
        return {name: lambda call=call: timing.seconds(call) for name, call in self.calls.items()}

    def sample(self, repeats: int = 3) -> dict[str, float]:
        """FLOP/s of each library's fastest of `repeats` matmuls, taking turns."""
        return {name: self.flops / t for name, t in timing.alternate(self.timers(), repeats).items()}


def matmul_by_dtype(n: int = 2048, rounds: int = 3) -> dict[str, dict[str, float]]:
    """{dtype: {library: FLOP/s}} of the best n x n matmul in float32 and bfloat16, all taking turns
    round by round. Shows what each library's kernels make of this CPU (PyTorch's bfloat16 uses the
    AMX units where the CPU has them; XLA:CPU's does not, as measured here)."""
    peaks = {dtype: MatmulPeak(n, dtype) for dtype in ("float32", "bfloat16")}
    timers = {(dtype, name): timer for dtype, peak in peaks.items() for name, timer in peak.timers().items()}
    best = timing.alternate(timers, rounds)
    return {dtype: {name: peak.flops / best[dtype, name] for name in peak.calls} for dtype, peak in peaks.items()}


# --- the two trainers ------------------------------------------------------------------------


def random_batches(vocab: int, batch: int, seq_len: int, count: int = 4) -> list[tuple[np.ndarray, np.ndarray]]:
    """`count` (inputs, targets) pairs of [B, T] int32 token windows, the targets shifted by one."""
    rng = np.random.default_rng(0)
    windows = rng.integers(0, vocab, (count, batch, seq_len + 1), dtype=np.int32)
    return [(w[:, :-1], w[:, 1:]) for w in windows]


class Ours:
    """Our train step (bench.steps.train_setup), driven as train.py drives it: a batch put on the
    mesh per step, the state donated, the previous step's metrics read one step late."""

    def __init__(self, config, **model_overrides):
        setup = train_setup(config, **model_overrides)
        t = config.train
        self.cfg, self.state, self.train_step = setup.cfg, setup.state, setup.step
        self.num_params, self.flops_per_token = setup.num_params, setup.flops_per_token
        self.tokens_per_step = t.batch_size * t.seq_len
        self.sharding = setup.batch.sharding
        self.batches = random_batches(self.cfg.vocab_size, t.batch_size, t.seq_len)
        self.i = 0

    def put(self, x: np.ndarray) -> jax.Array:
        return jax.make_array_from_process_local_data(self.sharding, x)

    def run(self, steps: int) -> None:
        pending = None
        for _ in range(steps):
            inputs, targets = self.batches[self.i % len(self.batches)]
            self.i += 1
            self.state, metrics = self.train_step(self.state, self.put(inputs), self.put(targets))
            if pending is not None:
                float(pending["loss"])  # train.py's check_finite, one step late
            pending = metrics
        float(pending["loss"])
        jax.block_until_ready(self.state)


class Theirs:
    """Hugging Face GPT2LMHeadModel with the same architecture, trained in PyTorch eager."""

    def __init__(self, config):
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
        torch.manual_seed(0)
        cfg = model_config(config.model)
        t, o = config.train, config.optim
        self.model = torch_gpt2(cfg).train()
        self.attn_implementation = self.model.config._attn_implementation
        self.optimizer = torch_adamw(self.model, o)  # optim.decay_mask's weight-decay groups
        self.grad_clip = o.grad_clip
        self.num_params = sum(p.numel() for p in self.model.parameters())
        self.batches = [
            (torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64)))
            for x, y in random_batches(cfg.vocab_size, t.batch_size, t.seq_len)
        ]
        self.i = 0

    def run(self, steps: int) -> None:
        for _ in range(steps):
            inputs, targets = self.batches[self.i % len(self.batches)]
            self.i += 1
            loss = torch_train_step(self.model, self.optimizer, inputs, targets, self.grad_clip)
            float(loss)  # the loss reaches the host every step, as in a training loop


def alternate(runners: dict[str, Callable[[int], None]], steps: int, rounds: int,
              peak: MatmulPeak) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per step of each runner, its fastest of `rounds` rounds of `steps` steps, the runners
    taking turns round by round; and the matmul peak (FLOP/s, JAX and PyTorch), sampled once per
    round between the runners, the best of the rounds. Each runner first runs one untimed step
    (compilation, warm-up)."""
    for run in runners.values():
        run(1)
    peaks = {"jax": 0.0, "torch": 0.0}

    def sample_peak(times: dict[str, list[float]]) -> None:
        peaks.update({k: max(v, peaks[k]) for k, v in peak.sample().items()})
        print("  " + ", ".join(f"{n} {t[-1] * 1e3:.0f} ms/step" for n, t in times.items())
              + f"; peak {max(peaks.values()) / 1e9:.0f} GFLOP/s", file=sys.stderr)

    timers = {name: lambda run=run: timing.seconds(lambda: run(steps)) / steps for name, run in runners.items()}
    return timing.alternate(timers, rounds, after_round=sample_peak), peaks


# --- the default recipe's pieces ------------------------------------------------------------

# Each piece of the modern recipe (configs/modern.py) added alone to the lecture GPT
# (configs/shakespeare.py): (model fields, optim fields). The same shape, batch and data.
RECIPE_PIECES = {
    "lecture GPT (configs/shakespeare.py)": ({}, {}),
    "+ Muon on the matrices": ({}, {"name": "muon"}),
    "+ RoPE": ({"position": "rope"}, {}),
    "+ RMSNorm, no biases": ({"norm": "rmsnorm", "norm_bias": False, "use_bias": False}, {}),
    "+ QK-norm": ({"qk_norm": True}, {}),
    "+ squared ReLU": ({"activation": "relu2"}, {}),
    "+ untied head, logit softcap": ({"tie_embeddings": False, "logit_softcap": 30.0}, {}),
}


def recipe_pieces(steps: int, rounds: int, peak: MatmulPeak) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per step of the lecture GPT with each piece of the default recipe added alone, and of
    the whole recipe at the lecture's batch (configs/modern_b32.py; configs/modern.py trains at 16), in
    alternating rounds; and the peak in those rounds."""
    runners = {}
    for name, (model, optim) in RECIPE_PIECES.items():
        config = shakespeare.get_config()
        config.optim.update(optim)
        runners[name] = Ours(config, **model).run
    runners["default recipe at batch 32 (configs/modern_b32.py)"] = Ours(modern_b32.get_config()).run
    return alternate(runners, steps, rounds, peak)


# --- where the time goes ---------------------------------------------------------------------


def step_matmuls(cfg: ModelConfig, batch: int, seq_len: int) -> tuple[Callable[[], object], float]:
    """(run, FLOPs): a jitted program doing exactly the matrix multiplies of one train step of a
    GPT-style model (multi-head attention, plain MLP, tied head) and nothing else, and their FLOPs.

    With weights W [out, in] as the model stores them (transformer/model/linear.py): forward Y = X W^T;
    backward dX = dY W and dW = dY^T X; attention Q K^T and P V forward, and
    dO V^T, P^T dO, dS K, dS^T Q backward, each head a [T, K] x [K, T] or [T, T] x [T, K] product.
    The operands differ per layer so that XLA cannot merge identical products. The time this takes
    is what the step would take if everything but the matmuls were free.
    """
    if cfg.attention != "mha" or cfg.num_kv_heads != cfg.num_heads or cfg.activation == "swiglu":
        raise ValueError("step_matmuls models multi-head attention with a plain MLP only")
    n, d, f, h, k, t = batch * seq_len, cfg.d_model, cfg.mlp_dim, cfg.num_heads, cfg.head_dim, seq_len
    rng = np.random.default_rng(0)
    arr = lambda *shape: jnp.asarray(rng.standard_normal(shape, dtype=np.float32) * 0.02)  # noqa: E731
    dense = [(d, h * k)] * 3 + [(h * k, d), (d, f), (f, d)]  # q, k, v, o, fc_in, fc_out
    acts = {a: arr(n, a) for a in {d, h * k, f}}  # X and dY of each width, shared by the layers
    layers = [
        dict(w=[arr(b, a) for a, b in dense], q=arr(batch, h, t, k), k=arr(batch, h, t, k),
             v=arr(batch, h, t, k), do=arr(batch, h, t, k))
        for _ in range(cfg.num_layers)
    ]
    p, ds = arr(batch, h, t, t), arr(batch, h, t, t)  # attention weights and their gradient
    embed = arr(cfg.vocab_size, d)
    dlogits = arr(n, cfg.vocab_size)

    @jax.jit
    def run(acts, layers, p, ds, embed, dlogits):
        out = []
        for layer in layers:
            for (a, b), w in zip(dense, layer["w"]):
                x, dy = acts[a], acts[b]
                out += [x @ w.T, dy @ w, dy.T @ x]
            q, k_, v, do = layer["q"], layer["k"], layer["v"], layer["do"]
            out += [jnp.einsum("bhtk,bhsk->bhts", q, k_), jnp.einsum("bhts,bhsk->bhtk", p, v),
                    jnp.einsum("bhtk,bhsk->bhts", do, v), jnp.einsum("bhts,bhtk->bhsk", p, do),
                    jnp.einsum("bhts,bhsk->bhtk", ds, k_), jnp.einsum("bhts,bhtk->bhsk", ds, q)]
        x = acts[d]
        out += [x @ embed.T, dlogits @ embed, dlogits.T @ x]
        return out

    flops = cfg.num_layers * (sum(3 * 2 * n * a * b for a, b in dense) + 6 * 2 * batch * h * t * t * k)
    flops += 3 * 2 * n * d * cfg.vocab_size
    args = (acts, layers, p, ds, embed, dlogits)
    return lambda: jax.block_until_ready(run(*args)), flops


def breakdown(config, steps: int, rounds: int, peak: MatmulPeak):
    """Seconds of our forward (loss), forward + backward (loss and gradients), the full step, and
    the step's matrix multiplies alone; the peak in those rounds; the multiplies' FLOPs."""
    ours = Ours(config)
    cfg = ours.cfg
    x, y = (ours.put(a) for a in ours.batches[0])
    forward = jax.jit(lambda p, x, y: loss_fn(p, cfg, x, y, None))
    backward = jax.jit(jax.value_and_grad(lambda p, x, y: loss_fn(p, cfg, x, y, None)))
    matmuls, flops = step_matmuls(cfg, config.train.batch_size, config.train.seq_len)
    runners = {
        # ours.state is read at each call: the full step donates it and returns a new one.
        "forward": lambda n: [jax.block_until_ready(forward(ours.state.params, x, y)) for _ in range(n)],
        "forward+backward": lambda n: [jax.block_until_ready(backward(ours.state.params, x, y)) for _ in range(n)],
        "full step": ours.run,
        "matmuls": lambda n: [matmuls() for _ in range(n)],
    }
    return (*alternate(runners, steps, rounds, peak), flops)


# --- the report ------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    args = parser.parse_args()
    rounds = 3 if args.quick else 5  # ours against PyTorch
    aux_rounds = 2 if args.quick else 3  # our variants, the breakdown
    steps = {"shakespeare": 2 if args.quick else 4, "baby_gpt": 1 if args.quick else 2}
    peak = MatmulPeak()

    def gflops(p: dict[str, float]) -> str:
        return f"{max(p.values()) / 1e9:.0f} (JAX {p['jax'] / 1e9:.0f}, PyTorch {p['torch'] / 1e9:.0f})"

    rows = []
    torch_step = {}  # seconds per PyTorch step, by config
    attention = ""
    for name, module in CONFIGS.items():
        config = module.get_config()
        ours, theirs = Ours(config), Theirs(config)
        attention = theirs.attn_implementation
        print(f"{name}: {ours.num_params:,} parameters (PyTorch {theirs.num_params:,})", file=sys.stderr)
        sec, peaks = alternate({"ours": ours.run, "torch": theirs.run}, steps[name], rounds, peak)
        tps = {k: ours.tokens_per_step / v for k, v in sec.items()}
        torch_step[name] = sec["torch"]
        mfu = {k: v * ours.flops_per_token / max(peaks.values()) for k, v in tps.items()}
        cfg, t = ours.cfg, config.train
        rows.append(
            f"| {name} (L {cfg.num_layers}, d {cfg.d_model}, B {t.batch_size} x T {t.seq_len}; "
            f"attention {cfg.attention_impl}, scan {cfg.scan_layers}) | {ours.num_params / 1e6:.2f}M | "
            f"{ours.flops_per_token / 1e6:.1f} | {tps['ours']:,.0f} | {tps['torch']:,.0f} | "
            f"{tps['ours'] / tps['torch']:.2f} | {mfu['ours']:.2f} | {mfu['torch']:.2f} | {gflops(peaks)} |"
        )
        del ours, theirs

    # Our variants on the baby GPT: which attention path and layer loop train fastest.
    config = baby_gpt.get_config()
    variants = {
        f"attention {impl}, scan {scan}": Ours(config, attention_impl=impl, scan_layers=scan)
        for scan in (False, True) for impl in ("reference", "xla")
    }
    print("baby_gpt variants:", file=sys.stderr)
    sec, variant_peaks = alternate({k: v.run for k, v in variants.items()}, steps["baby_gpt"], aux_rounds, peak)
    fastest = min(sec.values())
    variant_rows = []
    for name, seconds in sec.items():
        v = variants[name]
        tps = v.tokens_per_step / seconds
        variant_rows.append(f"| {name} | {tps:,.0f} | {fastest / seconds:.2f} | "
                            f"{tps * v.flops_per_token / max(variant_peaks.values()):.2f} |")
    del variants

    print("recipe pieces:", file=sys.stderr)
    pieces, piece_peaks = recipe_pieces(steps["shakespeare"], aux_rounds, peak)

    print("baby_gpt breakdown:", file=sys.stderr)
    parts, part_peaks, matmul_flops = breakdown(config, steps["baby_gpt"], aux_rounds, peak)
    by_dtype = matmul_by_dtype(rounds=aux_rounds)

    print(f"### Training throughput, float32 on {os.cpu_count()} CPU cores\n")
    print("FLOPs per token = 6N + 12·L·T·d (N: parameters without the position table; L layers, T "
          "sequence length, d width). MFU = tokens/s x FLOPs per token / peak; the peak is the best "
          "float32 2048x2048 matmul of JAX and PyTorch, sampled between the rounds of the same table. "
          f"torch = Hugging Face GPT2LMHeadModel, PyTorch eager (attention '{attention}'), AdamW. Rounds "
          "alternate (ours, torch, ours, ...); each side's fastest round.\n")
    print("| config | params | MFLOP/token | ours tok/s | torch tok/s | ours / torch | our MFU | torch MFU "
          "| peak GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\n### Our variants on baby GPT (alternating rounds; peak {gflops(variant_peaks)} GFLOP/s)\n")
    print("| variant | tok/s | speed / fastest | MFU |")
    print("|---|---|---|---|")
    print("\n".join(variant_rows))
    print(f"\n### The default recipe's pieces, one at a time (alternating rounds; peak {gflops(piece_peaks)} "
          "GFLOP/s)\n")
    print("Each row adds one piece of configs/modern.py to the lecture GPT (configs/shakespeare.py): same "
          "shape, batch 32 x 128, float32. Time per step only; what each piece does to the loss is "
          "configs/sweeps/recipe.py's question.\n")
    print("| model | ms/step | x lecture GPT |")
    print("|---|---|---|")
    lecture = pieces["lecture GPT (configs/shakespeare.py)"]
    for name, seconds in pieces.items():
        print(f"| {name} | {seconds * 1e3:.0f} | {seconds / lecture:.2f} |")
    print(f"\n### Where our baby-GPT step spends its time (alternating rounds; peak {gflops(part_peaks)} "
          "GFLOP/s)\n")
    print("| part | ms/step | share of the step |")
    print("|---|---|---|")
    full = parts["full step"]
    previous = 0.0
    for part, label in (("forward", "forward (loss)"), ("forward+backward", "backward (gradients)"),
                        ("full step", "optimizer + metrics (clip, AdamW, norms)")):
        ms = (parts[part] - previous) * 1e3
        cell = f"{ms:.0f}" if ms > 0 else f"~0 ({ms:.0f}: below the noise)"
        print(f"| {label} | {cell} | {max(ms, 0) / 1e3 / full:.0%} |")
        previous = parts[part]
    print(f"| full step | {full * 1e3:.0f} | 100% |")
    rate = matmul_flops / parts["matmuls"]
    print(f"| the step's matmuls alone (same shapes, nothing else; {matmul_flops / 1e9:.0f} GFLOP) "
          f"| {parts['matmuls'] * 1e3:.0f} | {parts['matmuls'] / full:.0%} |")
    print(f"\nThe step's matrix multiplies alone run at {rate / 1e9:.0f} GFLOP/s, "
          f"{rate / max(part_peaks.values()):.2f} of the 2048x2048 peak: the MFU ceiling at these shapes if "
          f"everything else were free. The full step reaches {matmul_flops / full / max(part_peaks.values()):.2f}; "
          f"the other {1 - parts['matmuls'] / full:.0%} of its time is everything that is not a matmul "
          "(softmax, GELU, layer norms, transposes, residual adds, AdamW). "
          f"PyTorch's whole baby-GPT step took {torch_step['baby_gpt'] * 1e3:.0f} ms in the first table: our "
          f"matmuls alone are {parts['matmuls'] / torch_step['baby_gpt']:.2f} of it.")
    print("\n### 2048 x 2048 matmul by library and dtype (alternating rounds)\n")
    print("| dtype | JAX (XLA:CPU) GFLOP/s | PyTorch GFLOP/s | JAX / PyTorch |")
    print("|---|---|---|---|")
    for dtype in ("float32", "bfloat16"):
        jax_rate, torch_rate = by_dtype[dtype]["jax"], by_dtype[dtype]["torch"]
        print(f"| {dtype} | {jax_rate / 1e9:,.0f} | {torch_rate / 1e9:,.0f} | {jax_rate / torch_rate:.2f} |")

if __name__ == "__main__":
    main()
