"""Sparse autoencoders on a trained model's named points: the SAE (`autoencoder.py`), spliced in as an
edit (`splice.py`), trained on activations captured on the fly (`training.py`), saved and loaded in
our layout and the published ones (`layouts.py`), and its features read (`features.py`)."""
