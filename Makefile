# One-command set-up: every target that needs Python creates .venv and installs the project first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb))

.PHONY: setup check demo test test-unit test-notebooks notebooks lab bench results lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev,zh]"
	touch $(STAMP)

# Before a workshop, on each laptop: Python, packages, corpora, tokenizer, training speed (20 s),
# Jupyter widgets, disk, memory; one line each, exit status 1 if anything failed.
check: $(STAMP)
	$(PY) -m bertlab doctor

demo: $(STAMP)
	$(PY) -m bertlab demo

test: test-unit test-notebooks

test-unit: $(STAMP)
	$(PY) -m pytest tests

test-notebooks: $(STAMP)
	$(PY) -m pytest --nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg -p no:cacheprovider notebooks

notebooks: $(STAMP)
	$(PY) tools/run_notebooks.py $(NOTEBOOKS)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks

# Side-by-side speed and quality measurements (minutes each; never part of `make test`).
BENCHES := tokenizer masking data train_step gpu_throughput
bench: $(STAMP)
	for b in $(BENCHES); do echo "== benchmarks/$$b.py"; $(PY) benchmarks/$$b.py || exit 1; done

# The experiments whose saved results the notebooks read (tens of minutes to hours on a CPU;
# finished cells are cached). Each JSON in benchmarks/results/ records the command that made it.
results: $(STAMP)
	$(PY) benchmarks/recipe_search.py --stage screen --minutes 3 --jobs 2
	$(PY) benchmarks/recipe_search.py --stage combine --minutes 3 --jobs 2
	$(PY) benchmarks/time_to_quality.py --minutes 4 --seeds 0 1 2 --threads 1
	$(PY) benchmarks/downstream.py
	$(PY) benchmarks/ablations.py --budget cpu-long --seeds 0 1 --jobs 2 --threads 1
	$(PY) benchmarks/chinese_wwm.py

lint: $(STAMP)
	$(VENV)/bin/ruff check bertlab tests benchmarks tools

clean:
	rm -rf $(VENV) runs .pytest_cache
