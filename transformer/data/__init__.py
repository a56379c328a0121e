"""The data: corpus, tokenizers, token stream, batches, prefetcher, data tasks; imports no other package."""
