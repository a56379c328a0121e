"""Looking inside a model: capture, logit lens and attribution, patching, ablation, the explorer, tree views."""
