"""The table a run chooses from: data tasks by `config.data.task`, evaluation metrics by the fields
that ask for them. Explicit, so that importing a module registers nothing; a new task or metric is a
line here.

    train(config, "runs/mine")    # set up the run with the config's task and metrics, then train it
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ml_collections import ConfigDict

from transformer.data.batches import text_task
from transformer.data.tasks import DataTask
from transformer.experiments.induction.induction import INDUCTION
from transformer.experiments.proteins.families import proteins_task
from transformer.experiments.recall.needle import needle_task
from transformer.experiments.recall.retrieval import EXACT_MATCH
from transformer.experiments.sinks.sinks import ATTENTION_SHARES
from transformer.experiments.tables.table_classifier import TABLE_ACCURACY
from transformer.experiments.tables.table_rows import table_task
from transformer.experiments.vision.image_task import image_task
from transformer.experiments.vqa.answers import VQA_ACCURACY
from transformer.experiments.vqa.questions import vqa_task
from transformer.run.signals import StopOnSignal
from transformer.training import loop, setup
from transformer.training.eval_metrics import EvalMetric

TASKS: dict[str, Callable[[ConfigDict], DataTask]] = {  # data.task -> build(config), which checks the config
    "text": text_task,  # windows of the corpus
    "needle": needle_task,  # needle-in-a-document questions
    "tables": table_task,  # synthetic classification tables (text=False)
    "images": image_task,  # pictures and their class for a ViT (text=False)
    "proteins": proteins_task,  # sequences of synthetic protein families (text=False)
    "vqa": vqa_task,  # questions about procedural pictures, answered in bytes (text=False)
}
METRICS: list[tuple[EvalMetric, Callable[[ConfigDict], bool]]] = [  # (metric, does the config ask for it?)
    (ATTENTION_SHARES, lambda config: bool(config.train.get("eval_attention_shares", False))),
    (INDUCTION, lambda config: bool(config.train.get("eval_induction", False))),
    (EXACT_MATCH, lambda config: config.data.task == "needle"
     and config.data.needle.get("graded", "answer") == "answer"),
    (TABLE_ACCURACY, lambda config: config.data.task in ("tables", "images")),  # the graded rows' accuracy
    (VQA_ACCURACY, lambda config: config.data.task == "vqa"),
]


def data_task(config: ConfigDict) -> DataTask:
    name = config.data.task
    if name not in TASKS:
        raise ValueError(f"data.task={name!r} is not known; use one of {', '.join(map(repr, sorted(TASKS)))} "
                         "(a new task is a line in transformer/experiments/catalog.py)")
    return TASKS[name](config)


def eval_metrics(config: ConfigDict) -> list[EvalMetric]:
    return [metric for metric, wanted in METRICS if wanted(config)]


def train(config: ConfigDict, workdir: str, hard_exit: bool = False, **options: Any) -> dict:
    """The run of `config` set up with its data task and evaluation metrics, then trained
    (`loop.train`'s options); a signal during the set-up stops it at once (`StopOnSignal`)."""
    if "sae" in config:  # a sparse autoencoder on a trained run's point (configs/sae.py)
        from transformer.analysis.sae.training import train_sae
        return train_sae(config, workdir, hard_exit)
    task, metrics = data_task(config), eval_metrics(config)
    with StopOnSignal(hard_exit):
        run = setup.set_up(config, workdir, task, metrics)
    return loop.train(run, **options)
