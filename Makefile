# Every target sets up .venv itself on a fresh machine.
PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: setup train sample test bench notebooks plot clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(PY) train.py --config configs/shakespeare.py --workdir runs/shakespeare

sample: $(STAMP)
	$(PY) sample.py --workdir runs/shakespeare --prompt "ROMEO:" --num_samples 2 --max_new_tokens 120

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile

bench: $(STAMP)
	$(PY) bench/run_all.py --out bench/results.md

plot: $(STAMP)
	$(PY) scripts/plot_metrics.py runs/shakespeare/metrics.jsonl docs/loss_curve.png --target 1.88

notebooks: $(STAMP)
	$(PY) -m pip install -q -e '.[notebooks]'
	.venv/bin/jupyter lab notebooks/

clean:
	rm -rf .venv .cache runs
