"""Train a decoder from a config file.

    python train.py --config configs/modern.py --workdir runs/shakespeare
    python train.py --config configs/llama.py --workdir runs/llama --config.train.steps=2000

Any config field can be overridden from the command line (--config.section.field=value). Starting
in a workdir that has checkpoints resumes from the latest one; nothing is written to the workdir
until the run's set-up (config, tokenizer, corpus, state, compiled steps) has succeeded. The loop
itself is `transformer.experiments.catalog.train` (notebooks and sweeps call it); this script parses the
flags, hides the libraries' INFO logs and turns errors into one line and an exit code.

Exit codes: 0 when the run reached train.steps (or train.run_steps of them), 1 for an error (one
line naming it), 2 for a bad command line, 130 / 143 after SIGINT (Ctrl-C) / SIGTERM: training
stops at the next step, saves a checkpoint and exits, so `train.py ... && sample.py ...` does not
go on with a partial model. A kill -9 loses at most the steps since the last checkpoint.

Output: the model line, a progress bar, the evaluation lines, a summary and (with
train.sample_tokens) a short sample. Metrics also go to workdir/metrics.jsonl and TensorBoard files
in workdir/tb. Its evaluation rows (and its first row, written when the set-up ends) carry
elapsed_seconds, the wall time since the process started, so the time taken to reach a loss,
start-up, compiling, evaluations and checkpoints included, reads off the log (a resumed run counts
from its own start). `--verbosity=0` shows the libraries' INFO logs (absl, orbax), hidden by default.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # the process's start, taken before the heavy imports: elapsed_seconds counts from it

import os
import signal

if __name__ == "__main__":  # Ctrl-C while the libraries load: end at once (nothing is written yet)
    for _sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(_sig, lambda signum, frame: os._exit(128 + signum))

import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from transformer.cli import config_flags_parser, exit_on_storage_error, exit_with_error, out_of_memory
from transformer.sampling.text import generate_text
from transformer.run.checkpoint import CheckpointError, quiet_checkpoint_failures
from transformer.experiments.catalog import train
from transformer.training.loop import Diverged
from transformer.training.setup import REPO, Run
from transformer.run.signals import Interrupted
from transformer.training.steps import TrainState

DEFAULT_CONFIG = os.path.join(REPO, "configs", "modern.py")

FLAGS = flags.FLAGS
# No default here: absl would load it while defining the flag, before the flags parser can report a bad
# override; config_flags_parser adds --config=DEFAULT_CONFIG when none is given.
config_flags.DEFINE_config_file("config", None, f"Config file (get_config()); default {DEFAULT_CONFIG}.")
flags.DEFINE_string("workdir", None, "Folder for checkpoints, metrics and the tokenizer.", required=True)


def print_sample(run: Run, state: TrainState) -> None:
    """At the end of a complete run: a short sample (train.sample_tokens), to see what it learned."""
    t = run.config.train
    if not t.sample_tokens or run.tokenizer is None:  # None: the task reads no text (a table task)
        return
    if run.hosts > 1:  # the params span the hosts' devices
        if run.host == 0:
            print(f"no sample in a multi-host run: python sample.py --workdir {FLAGS.workdir} draws one "
                  "from the checkpoint")
        return
    text = generate_text((run.cfg, state.params, run.tokenizer), "\n", t.sample_tokens, t.seed, temperature=0.8)
    print("\n--- sample ---\n" + text)


def init_distributed() -> None:
    """A multi-host run (docs/usage.md, "Several hosts"): with JAX_COORDINATOR_ADDRESS=host:port,
    JAX_NUM_PROCESSES=N and JAX_PROCESS_ID=i set, join the other processes, so the mesh spans every
    process's devices (on CPUs the collectives run over gloo)."""
    address = os.environ.get("JAX_COORDINATOR_ADDRESS")
    if not address:
        return
    try:
        count, index = int(os.environ["JAX_NUM_PROCESSES"]), int(os.environ["JAX_PROCESS_ID"])
    except (KeyError, ValueError):
        raise ValueError("JAX_COORDINATOR_ADDRESS is set, so this is a multi-host run: also set "
                         "JAX_NUM_PROCESSES (the number of processes) and JAX_PROCESS_ID (0 .. N-1)") from None
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices: collectives across processes
    jax.distributed.initialize(coordinator_address=address, num_processes=count, process_id=index)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}; overrides take the form --config.train.steps=10")
    if not FLAGS["verbosity"].present:  # the libraries' INFO lines (orbax logs ~45 per save)
        logging.set_verbosity(logging.WARNING)
    quiet_checkpoint_failures()  # one-line errors for a checkpoint that cannot be read or written
    try:
        init_distributed()
        train(FLAGS.config, FLAGS.workdir, hard_exit=True, started=STARTED, on_complete=print_sample)
    except Interrupted as e:
        print(str(e), file=sys.stderr)
        sys.exit(e.exit_code)
    except (ValueError, FileNotFoundError, CheckpointError, Diverged) as e:
        exit_with_error(e)
    except OSError as e:  # a full disk while tokenizing or writing metrics: one line; any other: raised
        exit_on_storage_error(e)
    except jax.errors.JaxRuntimeError as e:  # XLA's out-of-memory: one line with the fields that shrink a step
        exit_with_error(out_of_memory(e, FLAGS.config))


if __name__ == "__main__":
    app.run(main, flags_parser=config_flags_parser(DEFAULT_CONFIG))
