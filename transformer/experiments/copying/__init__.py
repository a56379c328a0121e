"""The copying corpus: random strings, each written twice."""
