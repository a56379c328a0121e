"""Attention sinks, registers and the rolling cache."""
