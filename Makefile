PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-slow test-lower-pins lint docs bench clean

# the lowest pins supported (constraints-lower.txt: transformers 4.46.2, lm-eval 0.4.8, as
# LLaDA's and Dream's own code needs) in a second, small environment, for the masked-LM,
# conditional (test_compare, and compare's exact paths through test_guidance and
# test_conventions), lm-eval and collator/MPTTrainer (test_hf_collator) tests; the tests' tiny BERT has the same weights under both
# (tests/mlm_helpers.py draws them itself)
VENV_LOWER := .venv-lower
STAMP_LOWER := $(VENV_LOWER)/.installed
LOWER_PIN_TESTS := tests/test_masked_lm.py tests/test_masked_diffusion.py \
	tests/test_conditional.py tests/test_compare.py tests/test_guidance.py \
	tests/test_conventions.py tests/test_lm_eval.py tests/test_model_claims.py \
	tests/test_sequence_input.py tests/test_tokenizer_checks.py \
	tests/test_hf_collator.py

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt torch==2.13.0
	$(PIP) install --quiet -c constraints.txt -e ".[all,test,docs]"
	touch $(STAMP)

venv: $(STAMP)

$(STAMP_LOWER): pyproject.toml constraints-lower.txt
	$(PYTHON) -m venv $(VENV_LOWER)
	$(VENV_LOWER)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_LOWER)/bin/python -m pip install --quiet -c constraints-lower.txt torch==2.13.0
	$(VENV_LOWER)/bin/python -m pip install --quiet -c constraints-lower.txt \
		-e ".[hf,lm-eval,test,antibody]"
	touch $(STAMP_LOWER)

demo: $(STAMP)
	$(VENV)/bin/mptlml demo --out runs/demo --overwrite
	$(VENV)/bin/mptlml reproduce antibody --out runs/demo-antibody --overwrite \
		--set num_sequences=8 --set pll=false

# make test: every test but those marked slow (a few minutes on 2 cores); make test-slow: those
# (CI runs both, .ci/run): together the whole suite
test: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadgroup -m "not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadgroup -m slow

test-lower-pins: $(STAMP_LOWER)
	$(VENV_LOWER)/bin/python -c "import transformers as t; print('transformers', t.__version__)"
	$(VENV_LOWER)/bin/python -m pytest -q -n auto --maxprocesses 4 --dist loadgroup \
		$(LOWER_PIN_TESTS)

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
	rm -rf $(VENV) $(VENV_LOWER) runs site
