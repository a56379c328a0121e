"""Tables: a model that classifies the rows of a synthetic table, against kNN and logistic regression."""
