"""The seed sweep that chose configs/recall.py's recipe: which changes make a run leave the
copy-any-value plateau (exact match about 1/3) reliably, and by which step.

    python sweep.py --sweep configs/sweeps/recall.py --workdir runs/sweeps/recall

Two rounds, every run in float32 with the reference attention (what a CPU runs; on a GPU the same
numbers up to rounding), 256 validation documents for val_exact_match:

- Round 1, "before_*": the recipe before the change (one question per row, full attention in every
  layer, 2,500 steps), and single changes to it: a local window in layers 0 and 2, three questions per
  row, twice the learning rates, AdamW. 1-3 seeds each.
- Round 2, "recipe_*": configs/recall.py as it is (window 16 in layers 0 and 2, three questions,
  1,200 steps) over 6 seeds, and two near variants (no extra questions with 1,600 steps; window 8).

Each variant names its seed (train.seed: initial weights and batch order), so the file lists exactly
the 32 runs of docs/experiments/retrieval_heads.md's table. They were measured on one H200 GPU, 16
`python train.py` processes side by side with these fields; this command trains them one after
another (on a 2-core CPU about 15-30 minutes a run).
"""

PRECISE = {  # what a CPU's `auto` chooses, fixed so a GPU run matches it
    "model.dtype": "float32",
    "model.attention_impl": "reference",
}
BEFORE = {  # configs/recall.py before the recipe changed: full attention, one question a row
    "model.attention_window": 0,
    "model.global_every": 0,
    "data.needle.questions": 1,
    "train.seq_len": 178,
    "train.steps": 2500,
    "train.eval_every": 250,
}
WINDOW_8 = {"model.attention_window": 8, "model.global_every": 2}
WINDOW_16 = {"model.attention_window": 16, "model.global_every": 2}
QUESTIONS_3 = {"data.needle.questions": 3, "train.seq_len": 228}
LR_2X = {"optim.muon_learning_rate": 0.04, "optim.learning_rate": 8e-3}

# name: (fields over configs/recall.py, seeds)
RUNS = {
    "before": (BEFORE, [0, 1, 2]),
    "before_window_8": ({**BEFORE, **WINDOW_8}, [0, 1, 2]),
    "before_window_16": ({**BEFORE, **WINDOW_16}, [0, 1, 2]),
    "before_questions_3": ({**BEFORE, **QUESTIONS_3}, [0, 1]),
    "before_window_16_questions_3": ({**BEFORE, **WINDOW_16, **QUESTIONS_3}, [0, 1]),
    "before_lr_2x": ({**BEFORE, **LR_2X}, [0]),
    "before_window_16_lr_2x": ({**BEFORE, **WINDOW_16, **LR_2X}, [0]),
    "before_adamw": ({**BEFORE, "optim.name": "adamw", "optim.learning_rate": 3e-3}, [0]),
    "recipe": ({}, [0, 1, 2, 3, 4, 5]),
    "recipe_one_question_1600": ({"data.needle.questions": 1, "train.seq_len": 178, "train.steps": 1600}, [0, 1, 2, 3, 4, 5]),
    "recipe_window_8": (WINDOW_8, [0, 1, 2, 3]),
}


def get_config():
    return dict(
        base="recall",
        overrides={**PRECISE, "train.checkpoint_every": 5000, "train.keep_checkpoints": 1},
        variants={
            f"{name}_seed{seed}": {**fields, "train.seed": seed}
            for name, (fields, seeds) in RUNS.items()
            for seed in seeds
        },
    )
