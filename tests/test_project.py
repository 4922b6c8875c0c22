"""Project-level checks: environment.yml matches pyproject, notebooks are stored executed and clean,
nbval's sanitizers are valid, and importing bertlab is silent and light."""

from __future__ import annotations

import configparser
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            pins[req.name.lower()] = str(req.specifier)
    return pins


# --------------------------------------------------------------------------------------------
# environment.yml


@pytest.fixture(scope="module")
def environment() -> dict:
    path = ROOT / "environment.yml"
    assert path.is_file(), "environment.yml is missing (README's conda instructions use it)"
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _pip_section(environment: dict) -> list[str]:
    sections = [d["pip"] for d in environment["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(sections) == 1, "environment.yml needs exactly one pip: section"
    return [str(item) for item in sections[0]]


def test_environment_python_satisfies_requires_python(environment):
    conda = [d for d in environment["dependencies"] if isinstance(d, str)]
    python = [d for d in conda if re.fullmatch(r"python\s*=+\s*[\d.]+", d)]
    assert len(python) == 1, f"pin python in environment.yml, got {conda}"
    version = re.split(r"=+", python[0])[-1].strip()
    assert version in SpecifierSet(_pyproject()["project"]["requires-python"])
    assert "pip" in conda


def test_environment_lists_the_same_dependencies_as_pyproject(environment):
    project = _pyproject()["project"]
    expected = {}
    for line in project["dependencies"] + [d for group in project["optional-dependencies"].values() for d in group]:
        req = Requirement(line)
        expected[req.name.lower()] = str(req.specifier)
    expected.update({k: v for k, v in _constraints().items() if k in expected})  # pins win
    listed = {}
    for item in _pip_section(environment):
        if item.startswith("-"):
            continue
        req = Requirement(item)
        listed[req.name.lower()] = str(req.specifier)
    assert listed == expected


def test_environment_installs_the_project_with_every_extra(environment):
    editable = [i for i in _pip_section(environment) if i.startswith("-e")]
    assert len(editable) == 1
    match = re.fullmatch(r"-e\s+\.\[([\w,\s]+)\]", editable[0])
    assert match, f"expected '-e .[extras]', got {editable[0]!r}"
    extras = {e.strip() for e in match.group(1).split(",")}
    assert extras == set(_pyproject()["project"]["optional-dependencies"])


# --------------------------------------------------------------------------------------------
# Notebooks: stored executed, in order, without volatile metadata


def _code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_stored_executed_and_clean(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert nb["nbformat"] == 4
    cells = _code_cells(nb)
    assert cells, f"{path.name} has no code cells"
    assert all(_source(c).strip() for c in cells), f"{path.name} has an empty code cell"
    counts = [c["execution_count"] for c in cells]
    assert counts == list(range(1, len(cells) + 1)), (
        f"{path.name}: execution counts {counts} are not 1..N; run tools/run_notebooks.py on it"
    )
    assert "widgets" not in nb["metadata"], f"{path.name} stores widget state"
    for cell in nb["cells"]:
        assert "execution" not in cell.get("metadata", {}), f"{path.name} stores cell timings"
    for i, cell in enumerate(cells, start=1):
        outputs = cell["outputs"]
        assert not [o for o in outputs if o["output_type"] == "error"], f"{path.name} cell [{i}] stored an error"
        source = _source(cell)
        if re.search(r"^\s*print\(|plt\.show\(\)", source, flags=re.M):
            assert outputs, f"{path.name} cell [{i}] prints or plots but has no stored output"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_follows_the_course_conventions(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = nb["cells"]
    for i, cell in enumerate(cells):
        source = _source(cell)
        if cell["cell_type"] == "code" and source.lstrip().startswith("# NBVAL_IGNORE_OUTPUT"):
            assert "assert" in source, (
                f"{path.name}: an NBVAL_IGNORE_OUTPUT cell needs an assert with a tolerance:\n{source[:200]}"
            )
        if cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"):
            before = cells[i - 1] if i else None
            assert before and before["cell_type"] == "markdown" and "Solution" in _source(before), (
                f"{path.name}: a hidden solution must follow a markdown 'Solution (click to expand)' cell"
            )
        assert "MPLBACKEND" not in source, f"{path.name} sets MPLBACKEND (breaks figure outputs)"


# --------------------------------------------------------------------------------------------
# nbval sanitizers


def test_sanitize_cfg_is_valid():
    parser = configparser.ConfigParser()
    read = parser.read(ROOT / "notebooks" / "sanitize.cfg", encoding="utf-8")
    assert read, "notebooks/sanitize.cfg is missing"
    assert parser.sections()
    for name in parser.sections():
        section = parser[name]
        assert "regex" in section and "replace" in section, f"[{name}] needs regex and replace"
        re.compile(section["regex"])
        # nbval silently drops a section whose replace is empty.
        assert section["replace"].strip(), f"[{name}] has an empty replace"


# --------------------------------------------------------------------------------------------
# Importing bertlab


def test_import_is_silent_and_does_not_load_transformers():
    code = "import bertlab, sys; assert 'transformers' not in sys.modules, 'transformers imported'"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
    assert out.stderr == ""
