"""Looking inside a model: attention shares (sinks, registers), retrieval scores and head
ablation, the attention explorer, and tree views. Sits above model, data, training and sampling."""
