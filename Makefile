# Every target sets up .venv itself on a fresh machine, installing only what it needs:
# training and sampling the package alone, the tests its `dev` extra, and so on.
PY := .venv/bin/python
PIP := $(PY) -m pip install -q
RUN ?= runs/shakespeare
# The JAX build that training and sampling install: cpu (the default), cuda (an NVIDIA GPU) or tpu,
# e.g. `make train JAX=cuda`. Each is the package alone plus its extra in pyproject.toml.
JAX ?= cpu
ifeq ($(filter $(JAX),cpu cuda tpu),)
$(error JAX=$(JAX) is not a JAX build this Makefile knows; use JAX=cpu, JAX=cuda or JAX=tpu)
endif
RUN_STAMP := .venv/.installed-run$(if $(filter-out cpu,$(JAX)),-$(JAX))

.PHONY: setup train sample test test-all mutation-check bench notebooks figures tensorboard plot clean

.venv/.created:
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	touch $@

# One stamp per extra; each is redone when pyproject.toml changes.
.venv/.installed-run: pyproject.toml .venv/.created
	$(PIP) -e .
	touch $@

# JAX=cuda / JAX=tpu: the package with the accelerator build of JAX.
.venv/.installed-run-cuda .venv/.installed-run-tpu: .venv/.installed-run-%: pyproject.toml .venv/.created
	$(PIP) -e '.[$*]'
	touch $@

.venv/.installed-%: pyproject.toml .venv/.created
	$(PIP) -e '.[$*]'
	touch $@

setup: $(RUN_STAMP)

train: $(RUN_STAMP)
	$(PY) train.py --config configs/modern.py --workdir runs/shakespeare

sample: $(RUN_STAMP)
	$(PY) sample.py --workdir $(RUN) --prompt "ROMEO:" --num_samples 2 --max_new_tokens 120

# `make test`: the default set, without the tests marked slow but with the end-to-end tests that
# tests/end_to_end.py keeps; `make test-all`: every test, then the mutation check.
PYTEST := $(PY) -m pytest -q -n 2 --dist loadfile --durations=30

test: .venv/.installed-dev
	$(PYTEST) -m "not slow"

test-all: .venv/.installed-dev
	$(PYTEST)
	$(PY) scripts/mutation_check.py

# Breaks the causal mask, the 1/sqrt(d_h) scale and the KV-cache write position, one at a time, in a
# scratch copy of the working tree, and requires the tests aimed at each to fail (part of test-all).
mutation-check: .venv/.installed-dev
	$(PY) scripts/mutation_check.py

bench: .venv/.installed-dev
	$(PY) bench/run_all.py --out bench/results.md

# The device check (docs/usage.md: "GPU and TPU"): compile time, training tokens/s and MFU, decode
# tokens/s and the largest batch on whatever backend JAX finds; e.g. `make accelerator JAX=cuda`.
.PHONY: accelerator
accelerator: $(RUN_STAMP)
	$(PY) bench/accelerator.py

# JUPYTER_PATH puts .venv's python3 kernel before any installed elsewhere (for another Python).
JUPYTER := JUPYTER_PATH=$(CURDIR)/.venv/share/jupyter .venv/bin/jupyter

# The notebooks save their figures into the run they use (runs/notebook_model/figures by default).
notebooks: .venv/.installed-notebooks
	$(JUPYTER) lab notebooks/

# One notebook run headless, in place, outputs kept: `make notebook NB=kv_cache` (notebooks/kv_cache.ipynb).
.PHONY: notebook
notebook: .venv/.installed-notebooks
	$(if $(NB),,$(error NB is not set: make notebook NB=NAME runs notebooks/NAME.ipynb, e.g. NB=kv_cache))
	test -f notebooks/$(NB:.ipynb=).ipynb || { echo "error: no notebook notebooks/$(NB:.ipynb=).ipynb; ls notebooks/*.ipynb lists them" >&2; exit 2; }
	$(JUPYTER) nbconvert --to notebook --execute --inplace notebooks/$(NB:.ipynb=).ipynb

# The committed pictures: docs/loss_curve.png from runs/shakespeare (`make train` first), then every
# notebook run in place (outputs kept, figures into docs/figures, results files into docs/experiments;
# trains runs/notebook_model if missing).
figures: .venv/.installed-notebooks
	$(PY) scripts/plot_metrics.py runs/shakespeare/metrics.jsonl docs/loss_curve.png --target 1.77
	NOTEBOOK_FIGURES=$(CURDIR)/docs/figures NOTEBOOK_RESULTS=$(CURDIR)/docs/experiments $(JUPYTER) nbconvert --to notebook --execute --inplace notebooks/*.ipynb

tensorboard: .venv/.installed-tensorboard
	.venv/bin/tensorboard --logdir runs

plot: $(RUN_STAMP)
	$(PY) scripts/plot_metrics.py $(RUN)/metrics.jsonl $(RUN)/loss_curve.png

clean:
	rm -rf .venv .cache .jax_cache runs

# A sweep file's variants, each trained into runs/sweeps/NAME/VARIANT, then NAME/results.md and NAME/val_loss.png;
# rerun to resume (finished variants are skipped).
.PHONY: sweep
SWEEP ?= configs/sweeps/lecture.py
sweep: $(RUN_STAMP)
	$(PY) sweep.py --sweep $(SWEEP) --workdir runs/sweeps/$(basename $(notdir $(SWEEP)))

# $(call publish_sweep,NAME): trains configs/sweeps/NAME.py into runs/sweeps/NAME (resuming), then
# copies its table into docs/sweeps/NAME.md.
define publish_sweep
	$(PY) sweep.py --sweep configs/sweeps/$(1).py --workdir runs/sweeps/$(1)
	mkdir -p docs/sweeps
	cp runs/sweeps/$(1)/results.md docs/sweeps/$(1).md
endef

# The lecture sweep, and its committed table and figure redrawn from the runs (docs/experiments/lecture_sweep.md).
.PHONY: lecture-sweep
lecture-sweep: $(RUN_STAMP)
	$(call publish_sweep,lecture)
	cp runs/sweeps/lecture/val_loss.png docs/figures/lecture_sweep.png
	$(call publish_sweep,lecture_seed1)

# The recipe sweep (configs/modern.py with one piece taken out at a time), and its committed table and
# figure redrawn from the runs (docs/experiments/recipe_sweep.md).
.PHONY: recipe-sweep
recipe-sweep: $(RUN_STAMP)
	$(call publish_sweep,recipe)
	cp runs/sweeps/recipe/val_loss.png docs/figures/recipe_sweep.png
