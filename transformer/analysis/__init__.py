"""Looking inside a model: capture of named points (capture.py), the logit lens and direct logit
attribution (lens.py), activation patching (patching.py), head ablation, attention shares, the
attention explorer, and tree views. Sits above model, data, run, training and sampling."""
