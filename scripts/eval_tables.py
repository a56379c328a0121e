"""Evaluate a table model (configs/tables.py) against kNN and logistic regression, and its soft look-up.

    python scripts/eval_tables.py runs/tables                          # 200 synthetic tables, 20 splits each
    python scripts/eval_tables.py runs/tables --tables 50 --splits 5   # quicker

Prints a Markdown table of accuracies (mean ± standard deviation over held-out synthetic tables of the
run's prior and over random splits of scikit-learn's iris, wine and breast-cancer tables, at most
--max_train_rows training rows each) and how the last layer's attention over the training rows compares
with a nearest-neighbour look-up (transformer/experiments/tables/table_classifier.py). Needs scikit-learn (the dev extra).
"""

from __future__ import annotations

import argparse
import time

from transformer.experiments.tables import table_classifier as table_analysis
from transformer.experiments.tables.table_rows import TablePrior
from transformer.cli import exit_with_error
from transformer.run.checkpoint import CheckpointError, Checkpointer, quiet_checkpoint_failures, restore_for_inference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdir", help="a run of configs/tables.py (holding checkpoints/)")
    parser.add_argument("--tables", type=int, default=200, help="held-out synthetic tables")
    parser.add_argument("--splits", type=int, default=20, help="random splits of each real table")
    parser.add_argument("--max_train_rows", type=int, default=100, help="training rows of a real table, at most")
    parser.add_argument("--lookup_tables", type=int, default=50, help="synthetic tables for the look-up statistics")
    args = parser.parse_args()
    started = time.perf_counter()
    quiet_checkpoint_failures()
    try:
        cfg, params, _ = restore_for_inference(args.workdir)
        if cfg.inputs != "table":
            raise ValueError(f"{args.workdir} holds a {cfg.inputs} model (model.inputs={cfg.inputs!r}), not a table "
                             "classifier: pass a run of configs/tables.py (sample.py reads text models)")
    except (FileNotFoundError, CheckpointError, ValueError) as e:
        exit_with_error(e)
    saved = Checkpointer(args.workdir, read_only=True).config()
    prior, rows = TablePrior.from_config(saved["data"]["tables"]), saved["train"]["seq_len"]
    results = table_analysis.evaluation(params, cfg, prior, args.tables, args.splits, args.max_train_rows, rows)
    print(table_analysis.markdown_table(results))
    print()
    lookup = table_analysis.lookup_over_tables(params, cfg, prior, args.lookup_tables, rows)
    print("| last layer, heads' mean, per test row | mean ± sd over tables |\n| --- | --- |")
    for name, value in lookup.items():
        print(f"| {name} | {value} |")
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
