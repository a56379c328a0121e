"""Command-line scripts of the repository (plot_metrics); run as `python scripts/NAME.py`."""
