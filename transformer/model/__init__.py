"""The model: its config, the maths (ops), norms, linear maps, position schemes, the key view (what a
query sees), attention, per-layer caches, input kinds and their heads, the decoder, edits of its
parameter tree, and the execution settings chosen per backend. Imports nothing else of the package."""
