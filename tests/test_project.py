"""Project-level checks: environment.yml matches pyproject, notebooks are stored executed and clean,
nbval's sanitizers are valid, and importing bertlab is silent and light."""

from __future__ import annotations

import ast
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
    views = {o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
             for c in cells for o in c["outputs"]
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})}
    state = nb["metadata"].get("widgets", {}).get(
        "application/vnd.jupyter.widget-state+json", {}).get("state", {})
    missing = sorted(views - set(state))
    assert not missing, (f"{path.name}: widget outputs {missing} have no saved state, so "
                         f"JupyterLab cannot draw them before Run All; run tools/run_notebooks.py")
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


# --------------------------------------------------------------------------------------------
# The package's shape: one concept per module, imports at the top, a small public surface

PACKAGE = ROOT / "bertlab"
MODULES = sorted(PACKAGE.rglob("*.py"))
COURSE = "course"  # bertlab/course/: the classroom's tools (notebook helpers, demo, doctor)
# Every bertlab module sits in one tier, and imports only from its own tier or those below; inside
# a tier, only without cycles. From the top (bertlab/README.md draws it):
TIERS: dict[str, tuple[str, ...]] = {
    # argv, run folders and run.json: the CLI, and one module per command that is more than a few
    # lines (its flags and its run together)
    "commands": ("__main__", "cli", "commands.__init__", "commands.flags", "commands.pretrain"),
    # the classroom: what the notebooks, `demo` and `doctor` use on top of the library
    "course": ("course.__init__", "course.ablations", "course.cloze", "course.demo",
               "course.doctor", "course.gpu_records", "course.grid", "course.traces",
               "course.twins", "course.viz", "course.widgets"),
    # the loop: the training step and loop, pretraining with its fast forward, fine-tuning and
    # downstream tasks, Hugging Face interop, trained models loaded and exported; the package face
    "loop": ("__init__", "train", "pretraining", "finetune", "downstream", "hf", "loading",
             "export"),
    # the engine: folders written whole and locked, output checks, devices, event logs,
    # checkpoints, resume, the run session around the loop's step, streaming and shards
    "engine": ("engine.__init__", "engine.folders", "engine.outputs", "engine.device",
               "engine.eventlog", "engine.checkpoint", "engine.resume", "engine.session",
               "engine.streaming", "engine.shards"),
    # the foundations: what BERT is, and what it is made from
    "foundations": ("errors", "corpus", "artefacts", "atomic", "config", "precision",
                    "tokenizer", "masking", "model", "pairs", "data", "zh", "recipes", "counts",
                    "textfiles", "rows", "readers"),
}
TIER = {module: rank for rank, modules in enumerate(reversed(TIERS.values())) for module in modules}
MAX_FUNCTION_LINES = 60
# Functions allowed past MAX_FUNCTION_LINES, each with its reason. Keep it empty.
LONG_FUNCTIONS: dict[str, str] = {}
# A call site should be readable: past this many parameters, settings belong in an options
# object (a dataclass such as FinetuneConfig) that names and checks them once.
MAX_PARAMETERS = 8
# Functions allowed more than MAX_PARAMETERS, by qualified name, each with its reason. Keep it
# short.
WIDE_FUNCTIONS: dict[str, str] = {
    "masking.mask_tokens": "its settings are one MaskingConfig; beside it, the public call "
                           "(bl.mask_tokens(ids, tok, mlm_probability=0.15, generator=g)) keeps "
                           "the mlm_probability= shorthand, and the other seven are "
                           "the call's data (ids, vocabulary, word ids, attention mask), its "
                           "randomness (generator or row seeds) and what it returns (decisions)",
}


def _name(path: Path) -> str:
    """Return a module's name inside the package: "model", "course.viz", "__init__"."""
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _bertlab_imports(node: ast.AST, here: str = "") -> list[str]:
    """Return the bertlab modules an import statement names ("bertlab.course.viz" -> "course.viz";
    a plain `import bertlab` or `from bertlab import __version__` -> "bertlab")."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:  # relative: resolve against the importing module's package
            package = here.split(".")[:-1][:len(here.split(".")) - node.level]
            base = ".".join(["bertlab", *package, *([node.module] if node.module else [])])
            names = [base] if node.module else [f"{base}.{a.name}" for a in node.names]
        elif node.module in ("bertlab", "bertlab.engine", "bertlab.course", "bertlab.commands"):
            folder = PACKAGE.joinpath(*node.module.split(".")[1:])
            names = [f"{node.module}.{a.name}" if (folder / f"{a.name}.py").exists()
                     or (folder / a.name).is_dir() else node.module for a in node.names]
        else:
            names = [node.module or ""]
    else:
        return []
    return [n.removeprefix("bertlab.") for n in names if n == "bertlab" or n.startswith("bertlab.")]


def _imports(path: Path) -> set[str]:
    here = _name(path)
    return {m for n in ast.walk(_tree(path)) for m in _bertlab_imports(n, here)} - {here}


def test_public_surface_is_one_short_list():
    import bertlab

    assert isinstance(bertlab.__all__, list) and len(bertlab.__all__) == len(set(bertlab.__all__))
    assert len(bertlab.__all__) <= 25, f"{len(bertlab.__all__)} public names; keep the top level short"
    exported = {n for n, v in vars(bertlab).items()
                if not n.startswith("_") and not isinstance(v, type(bertlab))}
    assert exported == set(bertlab.__all__), (
        f"__init__ defines names outside __all__: {sorted(exported - set(bertlab.__all__))}; "
        f"listed but missing: {sorted(set(bertlab.__all__) - exported)}")


def _code_lines(path: Path, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Return a function's lines of code: its docstring, comments and blank lines left out."""
    lines = path.read_text(encoding="utf-8").splitlines()[fn.lineno - 1:fn.end_lineno]
    body = fn.body
    doc = set()
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        doc = set(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(1 for number, line in enumerate(lines, start=fn.lineno)
               if number not in doc and line.strip() and not line.strip().startswith("#"))


def _functions() -> list[tuple[str, int]]:
    found = []
    for path in MODULES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((f"{_name(path)}.{node.name}", _code_lines(path, node)))
    return found


def test_functions_are_short():
    functions = _functions()
    assert len(functions) > 100, "the function walk found too little to be a check"
    long = [f"{name} ({n} lines)" for name, n in functions
            if n > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS]
    assert not long, (f"functions over {MAX_FUNCTION_LINES} lines of code: {', '.join(long)}; "
                      f"split them into named steps")
    stale = [name for name in LONG_FUNCTIONS
             if all(n <= MAX_FUNCTION_LINES for f, n in functions if f == name)]
    assert not stale, f"LONG_FUNCTIONS lists functions that are short now: {stale}"


def test_code_lines_leave_out_docstrings_and_comments(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('def f():\n    """Doc\n\n    more."""\n    # why\n\n    x = 1\n    return x\n',
                    encoding="utf-8")
    (fn,) = [n for n in ast.walk(_tree(path)) if isinstance(n, ast.FunctionDef)]
    assert _code_lines(path, fn) == 3  # def, x = 1, return x


def _parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> int:
    """Return how many parameters a function takes: positional, keyword-only, *args and **kwargs
    each count; a method's `self` or `cls` (its first, unless a staticmethod) does not."""
    args = fn.args
    n = (len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs)
         + (args.vararg is not None) + (args.kwarg is not None))
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
    bound = method and not static and bool(args.posonlyargs or args.args)
    return n - bound


def _parameter_counts(tree: ast.Module, module: str) -> list[tuple[str, int]]:
    """Return (qualified name, parameter count) of every function in a module, methods and
    nested functions included: "finetune.compare_downstream", "hooks.RunHooks.__init__"."""
    found = []

    def visit(node: ast.AST, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((f"{prefix}.{child.name}", _parameter_count(child, in_class)))
                visit(child, f"{prefix}.{child.name}", False)
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}.{child.name}", True)
            else:
                visit(child, prefix, in_class)

    visit(tree, module, False)
    return found


def test_functions_take_few_parameters():
    counts = [found for path in MODULES for found in _parameter_counts(_tree(path), _name(path))]
    assert len(counts) > 100, "the function walk found too little to be a check"
    wide = [f"{name} ({n})" for name, n in sorted(counts)
            if n > MAX_PARAMETERS and name not in WIDE_FUNCTIONS]
    assert not wide, (f"{len(wide)} functions take more than {MAX_PARAMETERS} parameters:\n  "
                      + "\n  ".join(wide) + "\ngroup their settings into an options object (a "
                      "dataclass such as FinetuneConfig), or list one in WIDE_FUNCTIONS with "
                      "its reason")
    stale = [name for name in WIDE_FUNCTIONS
             if all(n <= MAX_PARAMETERS for f, n in counts if f == name)]
    assert not stale, f"WIDE_FUNCTIONS lists functions that take few parameters now: {stale}"


def test_parameter_count_counts_every_kind_but_self(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f(a, /, b, *args, c, d=1, **kwargs):\n    def inner(x): ...\n"
                    "class C:\n    def m(self, a, *, b): ...\n"
                    "    @classmethod\n    def k(cls, a): ...\n"
                    "    @staticmethod\n    def s(a, b): ...\n"
                    "    if True:\n        def later(self): ...\n"
                    "def g(cls): ...\n", encoding="utf-8")
    assert _parameter_counts(_tree(path), "m") == [("m.f", 6), ("m.f.inner", 1), ("m.C.m", 2), ("m.C.k", 1),
                                       ("m.C.s", 2), ("m.C.later", 0), ("m.g", 1)]


def _inner_imports(path: Path) -> list[tuple[int, str]]:
    """Return (line, module) of every bertlab import inside a function or class of `path`."""
    return [(n.lineno, m) for fn in ast.walk(_tree(path))
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            for n in ast.walk(fn) for m in _bertlab_imports(n, _name(path))]


@pytest.mark.parametrize("path", MODULES, ids=[_name(p) for p in MODULES])
def test_bertlab_imports_sit_at_the_top(path):
    # The commands alone import the course inside the commands that need it (demo, doctor, the
    # printing of pretrain and fill-mask), so a library command never loads the course.
    inner = [f"line {line} ({m})" for line, m in _inner_imports(path)
             if not (_name(path) in TIERS["commands"] and m.startswith(COURSE + "."))]
    assert not inner, f"{_name(path)} imports bertlab modules inside functions ({', '.join(inner)})"


def test_the_cli_loads_the_course_only_in_the_commands_that_need_it():
    top = {m for n in _tree(PACKAGE / "cli.py").body for m in _bertlab_imports(n, "cli")}
    assert not [m for m in top if m.startswith(COURSE)], sorted(top)
    code = "import bertlab.cli, sys; print(sorted(m for m in sys.modules if 'course' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_import_parser_sees_every_form(tmp_path):
    cases = {"import bertlab": ["bertlab"], "import bertlab.model": ["model"],
             "from bertlab import __version__": ["bertlab"], "from bertlab import model": ["model"],
             "from bertlab.course.viz import plot": ["course.viz"],
             "from . import masking": ["masking"], "from .grid import recipe": ["course.grid"]}
    for code, expected in cases.items():
        (node,) = ast.parse(code).body
        here = "course.demo" if "grid" in code else "data"
        assert _bertlab_imports(node, here) == expected, code


def test_no_module_imports_the_whole_package():
    offenders = [_name(p) for p in MODULES if "bertlab" in _imports(p)]
    assert not offenders, f"{offenders} import the whole package (import bertlab); import the " \
                          f"module that defines the name instead"


def test_a_moved_module_or_name_still_imports_for_a_release_and_names_its_new_home():
    code = """
import warnings
warnings.simplefilter("error", DeprecationWarning)
for old, new, name in [("bertlab.engine.recipes", "bertlab.recipes", "Recipe"),
                       ("bertlab.engine.card", "bertlab.export or bertlab.hf", "save_hf"),
                       ("bertlab.engine.files", "bertlab.engine.folders", "save_tokenizer")]:
    try:
        __import__(old)
    except DeprecationWarning as e:
        assert new in str(e), e
    else:
        raise AssertionError(old + " imported without a warning")
warnings.simplefilter("ignore", DeprecationWarning)
from bertlab.engine.card import save_hf
from bertlab.engine.files import save_tokenizer, atomic_write_json, FolderLock
from bertlab.engine.tasks import finetune_classifier
from bertlab.engine.device import resolve_newton_schulz
from bertlab.engine.streaming import StreamingNspBuilder
import bertlab, bertlab.tokenizer, bertlab.precision, bertlab.engine.streaming as s
assert save_hf is bertlab.save_hf and finetune_classifier is bertlab.finetune_classifier
assert save_tokenizer is bertlab.tokenizer.save_tokenizer
assert resolve_newton_schulz is bertlab.precision.resolve_newton_schulz
assert StreamingNspBuilder is s.StreamingExampleBuilder
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr


def test_every_module_has_a_tier():
    modules = {_name(p) for p in MODULES}
    assert modules == set(TIER), (f"modules without a tier: {sorted(modules - set(TIER))}; "
                                  f"tiers naming no module: {sorted(set(TIER) - modules)}")
    assert len(TIER) == sum(len(m) for m in TIERS.values()), "a module is in two tiers"


def test_every_import_points_down():
    # Every import counts, lazy ones inside functions too; there is no list of exceptions.
    up = [f"{_name(p)} ({_tier(_name(p))}) -> {dep} ({_tier(dep)})" for p in MODULES
          for dep in sorted(_imports(p)) if TIER.get(dep, len(TIERS)) > TIER[_name(p)]]
    assert not up, ("imports that point up a tier: move the name down to where its users are, "
                    "or the importer up:\n" + "\n".join(up))


def _tier(module: str) -> str:
    return next((tier for tier, modules in TIERS.items() if module in modules), "none")


def test_the_tier_check_sees_an_import_that_points_up(tmp_path):
    # The check reads the same import forms the parser does: a lazy import in a function counts.
    code = "def f():\n    from bertlab.train import train_loop\n"
    (node,) = [n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.ImportFrom)]
    assert _bertlab_imports(node, "engine.session") == ["train"]
    assert TIER["train"] > TIER["engine.session"]


def test_what_the_course_teaches_lives_in_the_loop_or_the_foundations():
    # Every bl. name, and every name the README and the notebooks import, is defined in a loop or
    # foundation module: the lesson holds what it teaches.
    import bertlab

    lesson = set(TIERS["loop"]) | set(TIERS["foundations"])
    defined = {n: getattr(getattr(bertlab, n), "__module__", "bertlab") for n in bertlab.__all__}
    imported = re.compile(r"^\s*from bertlab\.([\w.]+) import", re.M)
    texts = [(ROOT / "README.md").read_text(encoding="utf-8")]
    texts += [_source(c) for nb in NOTEBOOKS for c in _code_cells(json.loads(nb.read_text()))]
    modules = {m for text in texts for m in imported.findall(text)}
    wrong = sorted({n for n, m in defined.items() if m.removeprefix("bertlab.") not in lesson
                    and m != "bertlab"}
                   | {m for m in modules if m not in lesson and not m.startswith(COURSE)})
    assert not wrong, f"taught, but defined under the engine or the commands: {wrong}"


def test_modules_depend_without_cycles():
    graph = {_name(p): _imports(p) for p in MODULES}
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import cycle: {' -> '.join(path + (name,))}"
        if name in done:
            return
        for dep in graph.get(name, ()):
            visit(dep, path + (name,))
        done.add(name)

    for name in graph:
        visit(name, ())


def test_model_imports_only_torch_and_the_label_constant():
    # The textbook encoder reads like minGPT's: torch, and -100 from the masking that writes it.
    # bertlab.errors gives its one check of a wrong-typed argument (check_type), so that
    # BertModel(None) says "config=None is a NoneType, not a bertlab BertConfig" at the door.
    allowed = set(sys.stdlib_module_names) | {"torch", "__future__", "bertlab.masking",
                                              "bertlab.errors"}
    tree = _tree(PACKAGE / "model.py")
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module if (n.module or "").startswith("bertlab.") else
                 (n.module or ".").split(".")[0] or "." for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom)}
    assert imported <= allowed, (f"model.py imports {sorted(imported - allowed)}; keep it torch "
                                 f"and bertlab.masking's IGNORE_INDEX only")
    from_masking = [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                    and n.module == "bertlab.masking" for a in n.names]
    assert from_masking == ["IGNORE_INDEX"], from_masking


_STAMP = re.compile(r"Taught in ((?:notebooks/\d\d_\w+\.ipynb[ ,and]*)+)")


def _stamps() -> list[tuple[str, str, str]]:
    found = []
    for path in MODULES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for match in _STAMP.finditer(ast.get_docstring(node) or ""):
                    for nb in re.findall(r"notebooks/\d\d_\w+\.ipynb", match.group(1)):
                        found.append((f"{_name(path)}.{node.name}", node.name, nb))
    return found


def test_lesson_links_name_a_notebook_that_uses_the_symbol():
    stamps = _stamps()
    assert stamps, "no 'Taught in notebooks/...' links found; the check would be empty"
    sources = {}
    wrong = []
    for where, name, nb in stamps:
        if nb not in sources:
            path = ROOT / nb
            assert path.is_file(), f"{where} links to {nb}, which does not exist"
            cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
            sources[nb] = "\n".join(_source(c) for c in cells)
        if not re.search(rf"\b{re.escape(name)}\b", sources[nb]):
            wrong.append(f"{where} -> {nb}")
    assert not wrong, "these docstrings link to a lesson that never mentions them:\n" + "\n".join(wrong)


# `bertlab.a.b.c`, or `bl.a` for `import bertlab as bl`: at least one dotted part, each a Python
# name, so a sentence's closing period never joins the name.
_DOTTED = re.compile(r"(?<![\w./-])(bertlab|bl)((?:\.[A-Za-z_]\w*)+)")
# A dotted word followed by "-" or "/", or ending in a file suffix, names a file, not an object.
_FILE_SUFFIXES = {"py", "json", "md", "txt", "toml", "lock", "ipynb", "cfg", "yml", "yaml", "log"}


def _dotted_names(text: str) -> list[tuple[int, str]]:
    """Return (line number, name) for each dotted bertlab name in `text` (`bl.` as `bertlab.`)."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in _DOTTED.finditer(line):
            parts = match.group(2).split(".")[1:]
            if line[match.end():match.end() + 1] in ("-", "/") or parts[-1] in _FILE_SUFFIXES:
                continue
            found.append((number, ".".join(["bertlab", *parts])))
    return found


def _resolves(name: str) -> bool:
    """Import the longest prefix of `name` that imports as a module, then getattr the rest."""
    import importlib
    import warnings

    parts = name.split(".")
    obj, depth = None, 0
    with warnings.catch_warnings():  # a moved module imports, with its DeprecationWarning
        warnings.simplefilter("ignore", DeprecationWarning)
        for k in range(1, len(parts) + 1):
            try:
                obj, depth = importlib.import_module(".".join(parts[:k])), k
            except ImportError:
                break
    for attr in parts[depth:]:
        if not hasattr(obj, attr):
            return False
        obj = getattr(obj, attr)
    return True


def _texts_that_name_bertlab() -> list[tuple[str, str]]:
    """Return (where, text) for the package, tools, benchmarks, README and each notebook cell."""
    files = [*MODULES, *sorted((ROOT / "tools").glob("*.py")),
             *sorted((ROOT / "benchmarks").glob("*.py")), ROOT / "README.md"]
    texts = [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in files]
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        texts += [(f"{path.relative_to(ROOT)} cell {i}", _source(c)) for i, c in enumerate(cells)]
    return texts


def test_dotted_name_scan_reads_names_not_sentences():
    text = ("See bertlab.masking.mask_tokens. Then `bl.load_corpus(name)`, bertlab.engine.\n"
            "bertlab-run.json, bertlab/engine/files.py, bertlab.egg-info, tbl.x, bertlab.cli.py")
    assert _dotted_names(text) == [(1, "bertlab.masking.mask_tokens"), (1, "bertlab.load_corpus"),
                                   (1, "bertlab.engine")]
    assert _resolves("bertlab.readers.iter_corpus") and _resolves("bertlab.masking")
    assert not _resolves("bertlab.iter_corpus") and not _resolves("bertlab.masking.nothing")


def test_every_dotted_bertlab_name_resolves():
    # A user follows `bertlab.x.y` from an error message or a docstring; it has to be there.
    names = [(f"{where}:{line}", name) for where, text in _texts_that_name_bertlab()
             for line, name in _dotted_names(text)]
    assert len(names) > 100, "the scan found too few dotted names to be a check"
    answers: dict[str, bool] = {}
    stale = [f"{where} {name}" for where, name in names
             if not answers.setdefault(name, _resolves(name))]
    assert not stale, ("these dotted names do not resolve; point them at where the object lives "
                       "now:\n" + "\n".join(stale))


# --------------------------------------------------------------------------------------------
# Packaging


def test_packaging_has_one_version_a_license_and_a_setuptools_that_reads_them():
    from importlib.metadata import version

    import bertlab

    project = _pyproject()
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "bertlab.__version__"}
    assert version("bertlab") == bertlab.__version__, "reinstall: the installed metadata is stale"
    assert (ROOT / "LICENSE").is_file() and project["project"]["license-files"] == ["LICENSE"]
    assert project["project"]["license"] in (ROOT / "LICENSE").read_text(encoding="utf-8")
    # A license given as a string (an SPDX expression) needs setuptools 77.
    (setuptools,) = [Requirement(r) for r in project["build-system"]["requires"]
                     if Requirement(r).name == "setuptools"]
    assert "76.9" not in setuptools.specifier and "77" in setuptools.specifier


def test_run_and_data_folders_are_ignored_and_make_test_lints():
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").split()
    assert "/runs/" in ignored and "/data/" in ignored
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^test: .*\blint\b", makefile, flags=re.M), "make test must run the linter"


# --------------------------------------------------------------------------------------------
# Committed records name paths relative to the repository, never one machine's

_MACHINE_PATH = re.compile(r"""(?:^|[\s"'=:(])(/(?:work|home|root|tmp|Users|mnt|opt|var)/[\w.+-]+)""")


def _committed_texts() -> list[tuple[str, str]]:
    texts = [(p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8"))
             for p in sorted((ROOT / "benchmarks" / "results").glob("*.json*"))
             + sorted(ROOT.glob("models/*/MANIFEST.json"))]
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            for out in cell.get("outputs", []):
                text = out.get("text") or "".join(out.get("data", {}).get("text/plain", []))
                texts.append((path.name, "".join(text) if isinstance(text, list) else text))
    return texts


def test_committed_records_and_outputs_hold_no_machine_paths():
    texts = _committed_texts()
    assert len(texts) > 100 and any("benchmarks/results" in name for name, _ in texts)
    found = sorted({f"{name}: {m.group(1)}" for name, text in texts
                    for m in _MACHINE_PATH.finditer(text)})
    assert not found, "absolute paths of one machine (store them relative to the repo):\n" + \
        "\n".join(found)


def test_the_machine_path_check_sees_one():
    assert _MACHINE_PATH.search('"out": "/work/main/runs/x.json"')
    assert _MACHINE_PATH.search("--out /tmp/abc/run")
    assert not _MACHINE_PATH.search('"out": "runs/x.json", "ratio": "3/4"')


# --------------------------------------------------------------------------------------------
# An untrained head's accuracy is not a result: no committed record gives an NSP figure for a run
# that did not train NSP

def _untrained_nsp_figures() -> list[str]:
    from bertlab.pairs import pair_objective
    from bertlab.recipes import Recipe

    found = []
    results = ROOT / "benchmarks" / "results"
    for path in sorted(results.glob("ablations-*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        untrained = set()
        for r in data["records"]:
            if not r["config"]["settings"]["nsp"]:
                untrained.add((r["cell"]["group"], r["cell"]["name"]))
                points = [r["metrics"], *r["metrics"].get("curve", [])]
                found += [f"{path.name}: {r['cell']['name']} seed {r['cell']['seed']}"
                          for p in points if p.get("nsp_accuracy") is not None]
        found += [f"{path.name}: summary {row['name']}" for row in data["summary"]
                  if (row["group"], row["name"]) in untrained and "nsp_accuracy_mean" in row]
    board = json.loads((results / "time_to_quality.json").read_text(encoding="utf-8"))
    for arm, spec in board["recipes"].items():
        runs = board["runs"][arm]
        if not spec["nsp"] and (board["summary"]["final"][arm]["nsp_accuracy"] is not None or any(
                run["final"].get("val_nsp_accuracy") is not None for run in runs)):
            found.append(f"time_to_quality.json: {arm}")
    for line in (results / "recipe_search.jsonl").read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if not r["spec"]["nsp"] and r.get("nsp_accuracy") is not None:
            found.append(f"recipe_search.jsonl: {r['trial']} seed {r['seed']}")
    for path in sorted(ROOT.glob("models/*/MANIFEST.json")):
        manifest = json.loads(path.read_text(encoding="utf-8"))
        objectives = Recipe.from_dict(manifest["recipe"]).objectives
        trains_pair_head = pair_objective(objectives) is not None
        if not trains_pair_head and any(k.startswith("nsp") for k in manifest.get("validation", {})):
            found.append(path.relative_to(ROOT).as_posix())
    return found


def test_no_record_gives_an_nsp_figure_for_a_run_that_did_not_train_nsp():
    found = _untrained_nsp_figures()
    assert not found, "NSP figures of runs that never trained NSP (record None, 'not trained'):\n" \
        + "\n".join(found)


def test_no_notebook_output_prints_an_nsp_figure_it_calls_untrained():
    figure = re.compile(r"NSP[^\n]{0,30}?\b0\.\d{2,}[^\n]*not trained|not trained[^\n]*NSP "
                        r"(?:acc\w*\s*)?0\.\d{2,}")
    found = [f"{name}: {m.group(0)}" for name, text in _committed_texts()
             if name.endswith(".ipynb") for m in figure.finditer(text)]
    assert not found, "\n".join(found)
    assert figure.search("kept 0.773; NSP 0.469 (not trained)")


# --------------------------------------------------------------------------------------------
# The times the course states come from a measurement: tools/run_notebooks.py records how long
# each notebook took, and under what load; the README's minutes column must agree with it

def _run_times() -> dict:
    return json.loads((ROOT / "notebooks" / "run_times.json").read_text(encoding="utf-8"))


def test_every_notebook_was_timed_on_a_quiet_machine_within_its_budget():
    from bertlab.course.doctor import PROMISED_MINUTES

    times = _run_times()
    for path in NOTEBOOKS:
        t = times.get(path.name)
        assert t, f"{path.name} has no recorded run time; run make notebooks"
        budget = 60 * PROMISED_MINUTES  # the doctor's promise is this budget
        assert t["seconds"] <= budget, f"{path.name} took {t['seconds']:.0f} s, over its " \
            f"{PROMISED_MINUTES:g} minutes"
        load = max(x for x in (t["load_average_before"], t["load_average_after"]) if x is not None)
        assert load <= t["cpus"] + 0.5, (
            f"{path.name} was timed at load average {load} on {t['cpus']} cores: its stored "
            f"times are a busy machine's; re-run it with the machine otherwise idle")


def test_the_readme_minutes_per_notebook_are_the_measured_ones():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\d\d_\w+)` \|.*\| (< 1|~\d+) \|$", readme, flags=re.M))
    assert len(rows) == len(NOTEBOOKS), f"README's course table lists {sorted(rows)}"
    for name, stated in rows.items():
        minutes = _run_times()[f"{name}.ipynb"]["seconds"] / 60
        expected = "< 1" if minutes < 1 else f"~{max(1, round(minutes))}"
        assert stated == expected, f"README says {name} takes {stated} min; measured {minutes:.1f}"


def test_the_readme_minutes_name_the_cpu_they_were_measured_on():
    # A minute on a CPU with native bf16 (AMX) is not a minute on one without: the table says which
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    header = re.search(r"^\| notebook \| the question it answers \| (.+) \|$", readme, flags=re.M)
    machines = {(t.get("cpu"), t.get("native_bf16")) for t in _run_times().values()}
    assert len(machines) == 1, f"run_times.json mixes machines: {machines}; run make notebooks"
    (cpu, native), = machines
    expected = f"minutes, 2 free cores ({cpu}, {'native' if native else 'no native'} bf16)"
    assert header and header[1] == expected, f"README's course table says {header and header[1]!r}"


def test_a_notebook_that_states_its_own_minutes_quotes_run_times_json():
    # "runs in about N minutes" restates notebooks/run_times.json: it names the record and agrees
    stated = re.compile(r"runs in about (\d+) minutes?(.{0,120})")  # the source follows
    found = 0
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        text = " ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        for minutes, rest in stated.findall(text.replace("\n", " ")):
            found += 1
            measured = _run_times()[path.name]["seconds"] / 60
            assert "run_times.json" in rest, f"{path.name} says it runs in {minutes} min without its source"
            assert int(minutes) == max(1, round(measured)), \
                f"{path.name} says about {minutes} min; notebooks/run_times.json has {measured:.1f}"
    assert found, "no notebook states its own minutes any more: drop this test"


def test_records_name_the_files_the_makefile_writes():
    # A results file's commands are the ones `make results` runs: same intermediate files
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    zh = json.loads((ROOT / "benchmarks" / "results" / "chinese_wwm.json").read_text(encoding="utf-8"))
    outs = re.findall(r"--out (\S+)", " ".join(m["command"] for m in zh["merged_from"]))
    assert outs and all(f"--out {o}" in makefile for o in outs), outs
    assert zh["command"].split("chinese_wwm.py ")[1] in makefile
    sentences = json.loads((ROOT / "benchmarks" / "results" / "nsp_sentences.json").read_text(encoding="utf-8"))
    assert sentences["command"].replace("python ", "$(PY) ", 1) in makefile


def test_every_test_the_readme_names_exists():
    """A README promise names the test that backs it; a renamed or deleted test would leave the
    promise unbacked, so each `test_...` name in README.md must be defined in tests/."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(?:(?:tests/)?\w+\.py::)?(test_\w+)`", readme))
    defined = {m for path in (ROOT / "tests").glob("test_*.py")
               for m in re.findall(r"^def (test_\w+)\(", path.read_text(encoding="utf-8"), re.M)}
    assert len(named) >= 30, f"the README names only {len(named)} tests"
    assert named <= defined, f"the README names tests that do not exist: {sorted(named - defined)}"


def test_the_study_notes_the_course_cites_are_there_to_read():
    # Every notebook that cites the study notes links the page that retells them.
    notes = ROOT / "notebooks" / "SOURCE_NOTES.md"
    assert notes.is_file(), "notebooks/SOURCE_NOTES.md is missing"
    citing = []
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        if "study notes" in text.lower():
            citing.append(path.name)
            assert "(SOURCE_NOTES.md)" in text, f"{path.name} cites the study notes without a link"
    assert len(citing) >= 5, f"only {citing} cite the study notes"
    page = notes.read_text(encoding="utf-8")
    for name in citing:  # the page names every notebook that cites it
        assert re.search(rf"\b{name[:2]}\b", page), f"SOURCE_NOTES.md never names {name[:2]}"
