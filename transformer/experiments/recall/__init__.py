"""Recall: needle-in-a-document facts and the heads that retrieve them."""
