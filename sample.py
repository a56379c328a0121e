"""Sample text from a trained model, printing it as it is generated.

    python sample.py --workdir runs/shakespeare --prompt "ROMEO:" --num_samples 3 \\
        --max_new_tokens 300 --temperature 0.8 --top_k 40
    python sample.py --workdir runs/shakespeare --prompt_file prompt.txt --step 1000
    python sample.py --hf_dir path/to/gpt2 --prompt "Hello, my name is"
    python sample.py --workdir runs/shakespeare --max_new_tokens 1024 --sinks 4   # 8x the context of 128

--sinks S continues past the model's context (max_seq_len) with a rolling cache of constant size:
every layer sees the first S tokens and the last max_seq_len - S (StreamingLLM); RoPE or no
positions only (a model with learned positions refuses, naming why).

Restores the parameters, model config and tokenizer of a training run's checkpoint (the latest, or
--step), or imports a Hugging Face model folder (--hf_dir). Each sample is drawn with its own key,
the same one it would get as row i of a batch, so a sample is reproducible from --seed alone.
"""

from __future__ import annotations

import os
import signal
import sys

import jax
from absl import app, flags, logging

from transformer.model.kv_cache import describe_cache_size
from transformer.cli import exit_with_error
from transformer.load import load_model
from transformer.run.checkpoint import CheckpointError, quiet_checkpoint_failures
from transformer.model.decoder import count_params
from transformer.sampling.sampler import SamplingOptions, check_seed
from transformer.sampling.text import print_samples, read_prompt

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A training run's folder (holding checkpoints/).")
flags.DEFINE_integer("step", None, "Checkpoint step to restore (default: the latest).")
flags.DEFINE_string("hf_dir", None, "A local Hugging Face model folder, instead of --workdir.")
flags.DEFINE_string("prompt", None, "Text the samples continue (default: a newline).")
flags.DEFINE_string("prompt_file", None, "Read the prompt from this file ('-': standard input) instead of --prompt.")
flags.DEFINE_integer("num_samples", 1, "Number of samples.", lower_bound=1)
flags.DEFINE_integer("max_new_tokens", 200, "Tokens to generate per sample.", lower_bound=1)
flags.DEFINE_float("temperature", 0.8, "Sampling temperature; 0 = greedy.", lower_bound=0.0)
flags.DEFINE_integer("top_k", 40, "Keep only the k most likely tokens; 0 = all.", lower_bound=0)
flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass in (0, 1]; 1 = all tokens.")
flags.DEFINE_integer("seed", 0, "Seed of the sampling keys, in [0, 2**63).")
flags.DEFINE_integer("chunk_size", 16, "Tokens generated between two prints.", lower_bound=1)
flags.DEFINE_integer("sinks", None, "Generate past the context: a rolling cache of constant size over the last "
                     "max_seq_len - S positions that keeps the first S tokens (StreamingLLM); 0: a plain rolling "
                     "window. RoPE or no positions only. Unset: stop at the context.", lower_bound=0)


def stop(signum: int, frame) -> None:
    """Ctrl-C / SIGTERM: keep what was printed and end at once (sampling writes nothing; an exception
    arriving in a compile could crash the interpreter's shutdown)."""
    sys.stdout.flush()
    print(f"\n{signal.Signals(signum).name}: stopped; the text above is what was generated", file=sys.stderr,
          flush=True)
    os._exit(128 + signum)


def main(argv: list[str]) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; the prompt goes in --prompt")
    logging.set_verbosity(logging.ERROR)  # orbax logs every restore; the samples are the output
    quiet_checkpoint_failures()  # one-line errors for a checkpoint that cannot be read or written
    try:
        prompt = read_prompt(FLAGS.prompt, FLAGS.prompt_file)  # a bad file fails before any loading
        check_seed(FLAGS.seed)  # and so does a bad seed, and a bad sampling option
        if not 0 < FLAGS.top_p <= 1:  # NaN too
            raise ValueError(f"--top_p {FLAGS.top_p} must be in (0, 1]; 1 (the default) keeps every token")
        SamplingOptions(temperature=FLAGS.temperature, top_k=FLAGS.top_k or None)
        cfg, params, tokenizer = load_model(FLAGS.workdir, FLAGS.hf_dir, FLAGS.step)
        print(f"model: {count_params(params):,} parameters, context {cfg.max_seq_len} tokens, KV cache "
              f"{describe_cache_size(cfg, FLAGS.sinks)}; dtype {cfg.dtype}, attention "
              f"{cfg.attention_impl} on {jax.default_backend()}", file=sys.stderr)
        print_samples(cfg, params, tokenizer, prompt, FLAGS.num_samples, FLAGS.max_new_tokens, FLAGS.seed,
                      FLAGS.chunk_size, sinks=FLAGS.sinks, temperature=FLAGS.temperature, top_k=FLAGS.top_k or None,
                      top_p=FLAGS.top_p if FLAGS.top_p != 1.0 else None)
    except (FileNotFoundError, CheckpointError, ValueError) as e:
        exit_with_error(e)


if __name__ == "__main__":
    app.run(main)
