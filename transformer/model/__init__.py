"""The model: its config, the maths (ops), norms, linear maps, attention, the KV cache, the decoder,
edits of its parameter tree, and the execution settings chosen per backend. Imports nothing else of
the package."""
