PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-fast lint docs bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt torch==2.13.0
	$(PIP) install --quiet -c constraints.txt -e ".[all,test,docs]"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mptlml demo --out runs/demo --overwrite
	$(VENV)/bin/mptlml reproduce antibody --out runs/demo-antibody --overwrite \
		--set num_sequences=8 --set pll=false

test: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadgroup

test-fast: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadgroup -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

# the documentation site (mkdocs.yml, docs/) into site/; any warning is an error, and is shown
# (no --quiet: it would hide the warnings from the strict count)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# the sizes of docs/results/performance.md (about 5 minutes on 2 idle cores); each script has --help
bench: $(STAMP)
	$(PY) benchmarks/bench_estimators.py
	$(PY) benchmarks/bench_training.py --threads 1
	$(PY) benchmarks/bench_latent.py --threads 1
	$(PY) benchmarks/bench_mlm.py --num-sequences 6 --repeats 2 --pll-sequences 2 --bert-batches 2

clean:
	rm -rf $(VENV) runs site
