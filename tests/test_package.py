"""bertlab as a researcher installs it: the wheel, in a folder of its own, used from another folder
that is not the checkout (issue 57). The course's models travel inside the package, so a name
finds them (`load_model("course-tiny")`, `fill-mask course-tiny`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bertlab.loading import check_model_folder, load_model, model_path, shipped_models

ROOT = Path(__file__).resolve().parents[1]


def test_a_shipped_model_is_found_by_its_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no models/ here
    assert shipped_models() == ["course-mlm", "course-nsp", "course-tiny"]
    model, tok = load_model("course-tiny")
    assert tok.get_vocab_size() == model.config.vocab_size
    assert check_model_folder("course-nsp") == "hf"
    (tmp_path / "course-mlm").mkdir()  # a folder of yours by that name is yours: it wins
    assert model_path("course-mlm") == Path("course-mlm")
    with pytest.raises(ValueError, match=r"pass .*or the name of a shipped model \(course-mlm, "
                                         r"course-nsp, course-tiny\)"):
        load_model("course-huge")


def _source_copy(to: Path) -> Path:
    """Copy the files git tracks (links stay links) to `to`: the wheel is built there, so the
    build leaves nothing in the checkout."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        target = to / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_symlink():
            os.symlink(os.readlink(ROOT / name), target)
        else:
            shutil.copy2(ROOT / name, target)
    return to


@pytest.mark.slow
def test_the_wheel_installed_elsewhere_loads_the_models_by_name_and_passes_the_doctor(tmp_path):
    from importlib.metadata import version

    # The wheel is built with this environment's setuptools (no download); pyproject.toml's
    # build-system asks for 77 or later, which builds wheels by itself.
    if int(version("setuptools").split(".")[0]) < 77:
        pytest.skip(f"setuptools {version('setuptools')} here; building the wheel offline needs "
                    f">= 77 (pip install 'setuptools>=77')")
    source = _source_copy(tmp_path / "source")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps",
                            "--no-build-isolation", "-q", "-w", str(tmp_path / "dist")],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("bertlab-*.whl")
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                                "--target", str(site), str(wheel)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "BERTLAB_CACHE": str(tmp_path / "cache")}

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *argv], cwd=elsewhere, env=env,
                              capture_output=True, text=True)

    code = ("import bertlab as bl\n"
            "print(bl.__file__)\n"
            "for name in ('course-tiny', 'course-nsp', 'course-mlm'):\n"
            "    model, tok = bl.load_model(name)\n"
            "    print(name, type(model).__name__, tok.get_vocab_size())\n")
    done = run("-c", code)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert Path(lines[0]).is_relative_to(site), lines[0]  # the wheel's, not the checkout's
    assert lines[1:] == [f"{name} BertForPreTraining 8192"
                         for name in ("course-tiny", "course-nsp", "course-mlm")]
    filled = run("-m", "bertlab", "fill-mask", "course-tiny", "the prime [MASK] said on monday")
    assert filled.returncode == 0 and "[MASK] #1: minister" in filled.stdout, \
        filled.stdout + filled.stderr
    doctor = run("-m", "bertlab", "doctor", "--seconds", "1.5")
    checks = [line.strip() for line in doctor.stdout.splitlines()
              if line.strip().split(" ")[0] in ("OK", "WARN", "INFO", "FAIL")]
    assert checks, doctor.stdout + doctor.stderr
    # Beside other busy programs (a shared test machine) the speed check rightly fails, saying
    # why; nothing else may.
    failed = [line for line in checks if line.startswith("FAIL") and not (
        "training speed" in line and ("other programs ran" in line or "cores busy" in line))]
    assert not failed, doctor.stdout
