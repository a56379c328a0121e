"""The data: the bundled corpus, tokenizers, the token stream on disk, batches, the prefetcher, and
the needle-in-a-document task. Imports nothing else of the package (not even the model)."""
