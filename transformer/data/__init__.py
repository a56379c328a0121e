"""The data: the bundled corpus, tokenizers, the token stream on disk, batches, the prefetcher, and
the DataTask a run trains on (tasks.py). Imports nothing else of the package (not even the model)."""
