"""The data: the bundled corpus, tokenizers, the token stream on disk, batches, the prefetcher, and
the data tasks (tasks.py) a run trains on. Imports nothing else of the package (not even the model).

Importing the package registers its three tasks: 'text' (batches.py), 'needle' (needle.py) and 'tables'
(tables.py)."""

from transformer.data import batches, needle, tables  # noqa: F401  (each registers its task)
