# One-command set-up: every target that needs Python creates .venv and installs the project first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb))

.PHONY: setup demo test test-unit test-notebooks notebooks lab bench lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev,zh]"
	touch $(STAMP)

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

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check bertlab tests benchmarks tools

clean:
	rm -rf $(VENV) runs .pytest_cache
