"""Train the variants of a config side by side, then tabulate and plot them.

    python sweep.py --sweep configs/sweeps/lecture.py --workdir runs/sweeps/lecture
    make sweep SWEEP=configs/sweeps/lecture.py                # the same, into runs/sweeps/lecture

The sweep file's format, how runs are named, resumed and checked: transformer/experiments/sweep.py,
whose `run_sweep` this script calls. Writes <workdir>/results.md and <workdir>/val_loss.png.

Exit codes: 0 when every run finished, 1 when a run failed while training (it is reported in the
table and the sweep goes on), 2 for a bad sweep file or a run folder of another config, 130 / 143
after Ctrl-C / SIGTERM (the current run saves a checkpoint first; rerun the command to go on).
"""

from __future__ import annotations

import argparse
import sys

from absl import logging

from transformer.cli import exit_on_storage_error, exit_with_error
from transformer.run.checkpoint import quiet_checkpoint_failures
from transformer.run.signals import Interrupted
from transformer.experiments.sweep import SweepError, run_sweep


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", required=True, help="a sweep file, e.g. configs/sweeps/lecture.py")
    p.add_argument("--workdir", required=True, help="the sweep's folder: one subfolder per run, and the results")
    args = p.parse_args(argv)
    logging.set_verbosity(logging.WARNING)  # the libraries' INFO lines (orbax logs ~45 per save), as train.py
    quiet_checkpoint_failures()  # one-line errors for a checkpoint that cannot be read or written
    try:
        return run_sweep(args.sweep, args.workdir)
    except SweepError as e:
        exit_with_error(e, 2)
    except Interrupted as e:
        print(str(e), file=sys.stderr)  # "... rerun the same command to resume"
        return e.exit_code
    except OSError as e:  # a full disk: one line (the runs so far are kept); any other: raised
        exit_on_storage_error(e)


if __name__ == "__main__":
    sys.exit(main())
