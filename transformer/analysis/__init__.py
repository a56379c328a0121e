"""Looking inside a model: attention shares (sinks, registers), retrieval scores and head
ablation, the attention explorer, and tree views. Sits above model, data, training and sampling.

Importing the package registers the training loop's attention-share metric (sinks.py)."""

from transformer.analysis import sinks  # noqa: F401  (registers the 'attention_shares' evaluation metric)
