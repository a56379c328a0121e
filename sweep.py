"""Train the variants of a config side by side, then tabulate and plot them.

    python sweep.py --sweep configs/sweeps/lecture.py --workdir runs/sweeps/lecture
    make sweep SWEEP=configs/sweeps/lecture.py                # the same, into runs/sweeps/lecture
    python sweep.py --sweep configs/sweeps/recipe.py --workdir runs/sweeps/recipe --jobs 4

The sweep file's format, how runs are named, resumed and checked: transformer/experiments/sweep.py,
whose `run_sweep` this script calls. Writes <workdir>/results.md and <workdir>/val_loss.png.

--jobs N trains N runs at once, each in a process of its own (`--run NAME`, its output in
<workdir>/logs/NAME.log), on one GPU (each process gets 0.9 / N of its memory unless
XLA_PYTHON_CLIENT_MEM_FRACTION is set) or over the CPU's cores; one after another otherwise, in this
process (JAX starts once). Every config and run folder is checked before anything trains, and a
rerun resumes each run where it stopped, however the sweep was stopped.

Exit codes: 0 when every run finished, 1 when a run failed while training (it is reported in the
table and the sweep goes on), 2 for a bad sweep file or a run folder of another config, 130 / 143
after Ctrl-C / SIGTERM (the running runs save a checkpoint first; rerun the command to go on).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from absl import logging

from transformer.cli import exit_on_storage_error, exit_with_error
from transformer.experiments.sweep import Job, SweepError, duration, load_sweep, plan, run_all, run_sweep
from transformer.run.checkpoint import latest_step, quiet_checkpoint_failures
from transformer.run.signals import Interrupted


def side_by_side(jobs: list[Job], n: int, sweep_path: str, workdir: str) -> dict[str, str]:
    """Trains the unfinished `jobs`, `n` at once, each by `sweep.py --run NAME` in a process of its own;
    returns {run name: error} for those that failed. Ctrl-C / SIGTERM stop every run (each saves a
    checkpoint first) and raise Interrupted."""
    todo = [job for job in jobs if latest_step(job.workdir) != job.config.train.steps]
    logs = os.path.join(workdir, "logs")
    os.makedirs(logs, exist_ok=True)
    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": f"{0.9 / n:.3f}", **os.environ}  # n processes share one GPU
    print(f"{len(jobs) - len(todo)} finished already; training {len(todo)}, {n} at once (logs in {logs})", flush=True)
    running, failures, done, signals = {}, {}, 0, []  # running: {name: (process, log file, start time)}

    def stop(signum, frame):  # SIGTERM stops the sweep as Ctrl-C does
        signals.append(signum)
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, stop)
    try:
        while todo or running:
            while todo and len(running) < n:
                job = todo.pop(0)
                log = open(os.path.join(logs, f"{job.name}.log"), "a")
                command = [sys.executable, os.path.abspath(__file__), "--sweep", sweep_path, "--workdir", workdir,
                           "--run", job.name]
                # A session of its own: Ctrl-C reaches this process alone, which stops each run once.
                process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
                running[job.name] = (process, log, time.perf_counter())
                print(f"started {job.name}", flush=True)
            time.sleep(0.2)
            for name, (process, log, started) in list(running.items()):
                if process.poll() is None:
                    continue
                log.close()
                del running[name]
                done += 1
                if process.returncode:
                    failures[name] = last_line(log.name) or f"exit code {process.returncode}"
                print(f"[{done}] {name}: {'failed: ' + failures[name] if name in failures else 'finished'} after "
                      f"{duration(time.perf_counter() - started)} ({log.name})", flush=True)
    except KeyboardInterrupt:
        for process, log, _ in running.values():
            process.send_signal(signal.SIGTERM)  # each run saves a checkpoint, then ends
        for process, log, _ in running.values():
            process.wait()
            log.close()
        raise Interrupted(signals[0] if signals else signal.SIGINT, f"stopped {', '.join(running) or 'no run'} after a checkpoint each "
                          f"({done} ended before); rerun the same command to resume") from None
    finally:
        signal.signal(signal.SIGTERM, before)
    finished = [job.name for job in jobs if latest_step(job.workdir) == job.config.train.steps]
    print(f"{len(finished)} of {len(jobs)} runs finished" + (f"; failed: {', '.join(failures)}" if failures else ""),
          flush=True)
    return failures


def last_line(path: str) -> str:
    """The last line of a run's log that is not blank: its error, when it failed."""
    with open(path, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", required=True, help="a sweep file, e.g. configs/sweeps/lecture.py")
    p.add_argument("--workdir", required=True, help="the sweep's folder: one subfolder per run, and the results")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at once, each in a process of its own")
    p.add_argument("--run", help=argparse.SUPPRESS)  # a side-by-side sweep's child: train this one run
    args = p.parse_args(argv)
    if args.jobs < 1:
        exit_with_error(SweepError(f"--jobs={args.jobs}: give the number of runs to train at once, 1 or more"), 2)
    logging.set_verbosity(logging.WARNING)  # the libraries' INFO lines (orbax logs ~45 per save), as train.py
    quiet_checkpoint_failures()  # one-line errors for a checkpoint that cannot be read or written
    try:
        if args.run:  # one run of the sweep, in this process
            jobs = [job for job in plan(load_sweep(args.sweep), args.sweep, args.workdir) if job.name == args.run]
            if not jobs:
                raise SweepError(f"{args.sweep} has no run named {args.run!r}")
            return 1 if run_all(jobs) else 0
        runner = run_all if args.jobs == 1 else (lambda jobs: side_by_side(jobs, args.jobs, args.sweep, args.workdir))
        return run_sweep(args.sweep, args.workdir, runner=runner)
    except SweepError as e:
        exit_with_error(e, 2)
    except Interrupted as e:
        print(str(e), file=sys.stderr)  # "... rerun the same command to resume"
        return e.exit_code
    except OSError as e:  # a full disk: one line (the runs so far are kept); any other: raised
        exit_on_storage_error(e)


if __name__ == "__main__":
    sys.exit(main())
