"""How many bertlab functions, in how many bertlab modules, does one optimizer step call?

The run is the demo's pretraining (`bertlab/course/demo.py`) through the command line: BBC News,
the course recipe, the tiny preset on the CPU, one torch thread, data loaded in this process
(`--num-workers 0`). `bertlab.cli.main` runs it here twice, for 3 steps and for 6, under
`sys.setprofile` (and `threading.setprofile`), each into a fresh folder. Neither run evaluates
or saves a checkpoint between its first step and its last (both intervals are 1000): the
evaluations at step 0 and at the end, and the final checkpoint, come the same in both runs. A
1-step run first writes the tokenizer that both reuse (`--tokenizer`) and fills every
first-call cache, so the two counted runs differ only in their steps.

A function belongs to the step when it is called more often in the 6-step run than in the
3-step one; its calls per step are (calls at 6 - calls at 3) / 3. A function is its code's file
relative to the folder that holds the package (`bertlab/model.py`, `bertlab/engine/session.py`:
any file under `bertlab.__file__`'s folder, `bertlab/course/` included and named apart) and its
qualified name (`co_qualname`). Nested named functions count as functions of their own;
lambdas and comprehensions (`<lambda>`, `<listcomp>`, `<genexpr>`, ...) count as part of the
function around them and are left out. A generator counts each time it resumes, as that runs
its code again. Calls that torch makes on its own threads (backward on a GPU) are not seen: the
run is on the CPU.

Usage: python tools/step_functions.py [--json PATH] [--steps 3 6] [PRETRAIN FLAGS ...]
Flags it does not know go to `pretrain` after the course run's and win (e.g. --corpus FOLDER).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import bertlab
from bertlab import cli

PACKAGE = Path(bertlab.__file__).resolve().parent
# The demo's pretraining on a CPU (bertlab/course/demo.py), as pretrain flags.
COURSE_RUN = ["--corpus", "bbc", "--recipe", "course", "--preset", "tiny", "--device", "cpu",
              "--threads", "1", "--num-workers", "0", "--eval-batches", "20"]
# Evaluations and checkpoints only at the ends, the same in both runs.
ENDS_ONLY = ["--eval-interval", "1000", "--checkpoint-interval", "1000"]
PARTS = ("<lambda>", "<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>")


def _key(code) -> tuple[str, str] | None:
    """Return (file relative to the package's parent, qualified name), or None outside bertlab."""
    path = Path(os.path.realpath(code.co_filename))
    if PACKAGE not in path.parents or code.co_name in PARTS:
        return None
    return (path.relative_to(PACKAGE.parent).as_posix(), getattr(code, "co_qualname", code.co_name))


def count_calls(argv: Sequence[str]) -> Counter:
    """Return the calls per bertlab function ((file, qualname) -> n) of `cli.main(argv)`."""
    calls: Counter = Counter()

    def hook(frame, event, arg):
        if event == "call":
            calls[frame.f_code] += 1

    said = io.StringIO()
    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            code = cli.main(list(argv))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    if code != 0:
        raise RuntimeError(f"bertlab {' '.join(argv)} exited {code}:\n{said.getvalue()[-3000:]}")
    found: Counter = Counter()
    for c, n in calls.items():
        if (key := _key(c)) is not None:
            found[key] += n
    return found


def step_functions(flags: Sequence[str] = (), steps: tuple[int, int] = (3, 6)) -> dict:
    """Return {"functions", "modules", "course_modules", "by_module": {file: {qualname: calls
    per step}}, "argv", "steps"} for the course run with `flags` appended (they win)."""
    few, many = steps
    with tempfile.TemporaryDirectory(prefix="step-functions-") as tmp:
        warm = Path(tmp, "warm-up")
        count_calls(["pretrain", *COURSE_RUN, *ENDS_ONLY, *flags, "--out", str(warm),
                     "--max-steps", "1"])
        argv = ["pretrain", *COURSE_RUN, *ENDS_ONLY, "--tokenizer", str(warm / "tokenizer.json"),
                *flags]
        counts = [count_calls([*argv, "--out", str(Path(tmp, f"run-{n}")), "--max-steps", str(n)])
                  for n in (few, many)]
    by_module: dict[str, dict[str, float]] = {}
    for (module, name), n in sorted(counts[1].items()):
        if n > counts[0][module, name]:
            by_module.setdefault(module, {})[name] = (n - counts[0][module, name]) / (many - few)
    course = PACKAGE.name + "/course/"
    return {"functions": sum(map(len, by_module.values())), "modules": len(by_module),
            "course_modules": [m for m in by_module if m.startswith(course)],
            "by_module": by_module, "argv": argv, "steps": list(steps)}


def format_report(result: dict) -> str:
    """Return the result as a short text table, grouped by module."""
    few, many = result["steps"]
    lines = [f"one optimizer step ({few} vs {many} steps): {result['functions']} bertlab "
             f"functions in {result['modules']} modules"]
    if result["course_modules"]:
        lines.append(f"of them course modules: {', '.join(result['course_modules'])}")
    lines.append(f"{'calls/step':>10}  function")
    for module, functions in result["by_module"].items():
        lines.append(f"{module} ({len(functions)})")
        lines += [f"{n:>10g}  {name}" for name, n in functions.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the result as JSON here")
    parser.add_argument("--steps", type=int, nargs=2, default=(3, 6), metavar=("FEW", "MANY"),
                        help="the two step counts compared (default: 3 6)")
    args, flags = parser.parse_known_args(argv)
    if not 0 < args.steps[0] < args.steps[1]:
        parser.error("--steps FEW MANY: pass 0 < FEW < MANY")
    result = step_functions(flags, tuple(args.steps))
    print(format_report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
