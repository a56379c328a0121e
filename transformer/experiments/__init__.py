"""The experiments, one folder each (data task, metric and analysis); catalog.py is the table a run chooses from."""
