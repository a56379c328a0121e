"""Induction and previous-token heads."""
