"""Looking inside a model: capture of named points (capture.py), the logit lens and direct logit
attribution (lens.py), activation patching (patching.py), induction heads (induction.py), attention
shares (sinks, registers), retrieval scores and head ablation, the attention explorer, and tree
views. Sits above model, data, training and sampling.

Importing the package registers the training loop's evaluation metrics: attention shares (sinks.py),
induction scores (induction.py), the needle task's exact match (retrieval.py) and the table task's
accuracy (tables.py)."""

from transformer.analysis import induction, retrieval, sinks, tables  # noqa: F401  (register the loop's metrics)
