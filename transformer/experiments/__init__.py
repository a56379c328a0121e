"""The experiments, one folder each: its data task, evaluation metric and analysis together.

    recall/     needle-in-a-document facts (needle.py) and retrieval heads (retrieval.py)
    tables/     synthetic classification tables (table_rows.py) and the table classifier (table_classifier.py)
    sinks/      attention sinks and registers (sinks.py), the rolling cache's loss (streaming.py)
    induction/  induction and previous-token heads on repeated tokens (induction.py)
    copying/    the copying corpus (copying.py)

catalog.py is the table a run's config chooses its data task and metrics from.
"""
