"""A GPU session for issue 25, prepared on the CPU: one smoke call, then one full call in phases.

GPU time is short (a lent H200 for minutes), so everything the GPU does is written down here and
tried on the CPU first. Before the session, on this machine:

    make gpu-data        # data/bbc_shards (128 tokens, 16 pair draws) and data/bbc_shards64

On the GPU machine, from the repository root, carrying data/ (about 45 MB):

    python3 tools/gpu_session.py smoke --out $OUT      # compile + a few steps of each script
    python3 tools/gpu_session.py full --out $OUT --twin-steps N      # under 8 minutes

The full call runs four phases, each under its own deadline, each writing as it goes, so a late
phase that runs out of time costs nothing earlier:
  1. base at 128 tokens, bertlab and transformers, full and real BBC batches -> gpu_throughput.json
     (the smoke call compiled these graphs, so this phase finds them in the inductor cache)
  2. the pretraining twins (benchmarks/gpu_pretrain.py train), 4 runs at once, about 3 minutes
  3. the other throughput rows, most telling first: base at 128 on BBC batches grouped by
     length (less padding, most batches unmasked), on BBC batches unpadded (the blocks skip the
     padding), compiled layer by layer (is regional compilation as fast?), mini and tiny at
     128, base at 512; added to the record
  4. the profile of base at 128 (top kernels by time), added to gpu_throughput.json
Then each run folder is packed into its own archive under $OUT (each well under 16 MiB).
The inductor cache lives in .cache/inductor (ignored), so the full call reuses the smoke's.

Back here, with the folder the full call's $OUT came back to:

    python tools/gpu_session.py receive --from FOLDER     # runs/gpu-twins + gpu_throughput.json
    python benchmarks/gpu_pretrain.py score --runs runs/gpu-twins      # what the twins learned

`receive` refuses a record or a run made on the CPU, and a runs folder that already holds runs.
`--device cpu` walks the same phases on the CPU with tiny sizes (a check of the commands only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def phase(name: str, cmd: list[str], deadline_s: float, log: Path) -> bool:
    """Run one phase under its deadline; return whether it finished. Output goes to `log` (and
    its tail to the console), so a phase cut short still shows how far it got."""
    print(f"== {name} (deadline {deadline_s:.0f} s): {' '.join(cmd)}", flush=True)
    start, seen = time.perf_counter(), log.stat().st_size if log.exists() else 0
    with open(log, "a") as out:
        try:
            done = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=deadline_s)
            ok = done.returncode == 0
        except subprocess.TimeoutExpired:
            ok = False
            out.write(f"\n{name}: stopped at its deadline of {deadline_s:.0f} s\n")
    tail = log.read_bytes()[seen:].decode(errors="replace").strip().splitlines()[-6:]
    print("\n".join(tail))
    print(f"== {name}: {'done' if ok else 'NOT finished'} in {time.perf_counter() - start:.0f} s",
          flush=True)
    return ok


def pack_runs(runs: Path, out: Path) -> None:
    """Pack each run folder (summary.json and its bf16 model) into out/<run>.tgz, and the logs
    and train.json into out/twins-logs.tgz: files small enough to come back one by one."""
    for folder in sorted(p for p in runs.iterdir() if p.is_dir()):
        with tarfile.open(out / f"{folder.name.replace('+', '-')}.tgz", "w:gz") as tar:
            tar.add(folder, arcname=folder.name)
    with tarfile.open(out / "twins-logs.tgz", "w:gz") as tar:
        for f in sorted(runs.iterdir()):
            if f.is_file():
                tar.add(f, arcname=f.name)


def receive(came_back: Path, runs: Path, results: Path) -> int:
    """Unpack what the full call returned: each run archive into `runs` (summary.json and its
    model, with train.json and the logs beside them, as gpu_pretrain.py score reads them) and
    gpu_throughput.json into `results`. Refuses, writing nothing, a CPU walk's files (they are no
    GPU result) and a `runs` folder that already holds runs (an earlier session's twins)."""
    # Imported here, not at the top: the GPU machine runs this script without bertlab installed.
    from bertlab.course.gpu_records import made_on_cpu
    from bertlab.util import atomic_write_bytes
    record_path = came_back / "gpu_throughput.json"
    archives = sorted(came_back.glob("*.tgz"))
    if not record_path.is_file() and not archives:
        print(f"gpu_session receive: {came_back} holds neither gpu_throughput.json nor run "
              f"archives (*.tgz); pass the folder the full call's $OUT came back to")
        return 2
    log = came_back / "full.log"
    phases = [line for line in (log.read_text(errors="replace").splitlines()
                                if log.is_file() else []) if line.startswith("phases: ")]
    print(phases[-1] if phases else f"no 'phases:' line in {log}: the full call may have been cut")
    sources = []
    if record_path.is_file():
        try:
            record = json.loads(record_path.read_text())
        except json.JSONDecodeError as e:
            print(f"gpu_session receive: {record_path} is not whole JSON ({e}): it was cut on "
                  f"its way back; nothing was written. Fetch the files again")
            return 2
        sources.append((record_path.name, record))
    for archive in archives:
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if not (member.isfile() or member.isdir()) or Path(member.name).is_absolute() \
                        or ".." in Path(member.name).parts:
                    print(f"gpu_session receive: {archive} holds {member.name!r}, which is not a "
                          f"plain file inside its run folder; nothing was written")
                    return 2
                if member.name.endswith("summary.json"):
                    sources.append((f"{archive.name}:{member.name}",
                                    json.load(tar.extractfile(member))))
    on_cpu = [name for name, made in sources if made_on_cpu(made)]
    if on_cpu:
        print(f"gpu_session receive: {', '.join(on_cpu)} came from a CPU walk (device 'cpu'), "
              f"not a GPU; nothing was written. Receive the files of a GPU session's full call")
        return 2
    if archives and runs.is_dir() and any(runs.iterdir()):
        print(f"gpu_session receive: {runs} already holds runs; nothing was written. Move it "
              f"aside (or pass --runs NEW_FOLDER), then receive again")
        return 2
    for archive in archives:
        with tarfile.open(archive) as tar:  # checked above: plain files inside `runs`
            tar.extractall(runs, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        print(f"unpacked {archive.name} into {runs}")
    if record_path.is_file():
        results.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(results / record_path.name, record_path.read_bytes())
        print(f"copied {record_path.name} ({sources[0][1]['device']}) into {results}")
    if archives:
        print(f"next: python benchmarks/gpu_pretrain.py score --runs {runs}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("call", choices=("smoke", "full", "receive"))
    p.add_argument("--from", dest="came_back", type=Path,
                   help="receive: the folder the full call's $OUT came back to")
    p.add_argument("--runs", type=Path, default=ROOT / "runs" / "gpu-twins",
                   help="receive: where the twins' run folders go")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results",
                   help="receive: where gpu_throughput.json goes")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu-session")))
    p.add_argument("--twin-steps", type=int, default=3000,
                   help="every twin's step budget (set it from the smoke call's tokens/s)")
    p.add_argument("--twin-minutes", type=float, default=3.0,
                   help="and a deadline for the twins' training (a run that reaches it says so)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--data", type=Path, default=ROOT / "data",
                   help="the folder holding bbc_shards and bbc_shards64 (make gpu-data)")
    args = p.parse_args(argv)
    if args.call == "receive":
        if args.came_back is None:
            p.error("receive needs --from FOLDER (where the full call's $OUT came back to)")
        return receive(args.came_back, args.runs, args.results)
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / ".cache" / "inductor"))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["PYTHONPATH"] = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    cpu = args.device == "cpu"
    shards, shards64 = args.data / "bbc_shards", args.data / "bbc_shards64"
    for folder in (shards, shards64):
        if not (folder / "tokenizer.json").is_file():
            print(f"gpu_session: {folder} is missing; run `make gpu-data` here and carry data/")
            return 1
    throughput = [PY, "benchmarks/gpu_throughput.py", "--device", args.device, "--shards",
                  str(shards), "--out", str(args.out / "gpu_throughput.json")]
    twins = [PY, "benchmarks/gpu_pretrain.py", "train", "--device", args.device, "--shards",
             str(shards), "--shards64", str(shards64)]
    log = args.out / f"{args.call}.log"
    work = args.out.parent / f".{args.out.name}-work"  # beside $OUT, not in it
    if cpu:  # the commands on tiny sizes: a check that each phase runs, no measurement
        throughput += ["--batch-size", "4", "--vocab-size", "500", "--warmup", "1", "--steps",
                       "1", "--no-compile"]
        twins += ["--preset", "tiny", "--batch-size", "8", "--eval-batches", "2", "--threads",
                  "1", "--num-workers", "0", "--seeds", "0"]
    base = ["tiny:128:full", "tiny:128:real"] if cpu else ["base:128:full", "base:128:real"]
    if args.call == "smoke":
        # Phase 1's graphs, both implementations, compiled once here: the full call, on the same
        # warm machine, finds them in the inductor cache and spends its deadline measuring.
        ok = phase("smoke: throughput", [*throughput, "--rows", *base, "--warmup", "2",
                                         "--steps", "2"], 300, log)
        ok &= phase("smoke: twins", [*twins, "--runs", str(work / "smoke-runs"), "--steps",
                                     "30", "--eval-interval", "30", "--eval-batches", "2"],
                    240, log)
        return 0 if ok else 1
    results = {}
    results["1 base"] = phase("phase 1: base at 128", [*throughput, "--rows", *base], 90, log)
    runs = work / "runs"  # packed into $OUT below: few files come back from there
    results["2 twins"] = phase("phase 2: twins", [
        *twins, "--runs", str(runs), "--steps", str(4 if cpu else args.twin_steps),
        "--minutes", str(args.twin_minutes)] + (["--eval-interval", "2"] if cpu else []),
        (args.twin_minutes + 1) * 60, log)
    if runs.is_dir():
        pack_runs(runs, args.out)
    # Most telling first: each row is written as it finishes, so a deadline costs the last ones.
    rest = (["tiny:128:grouped", "tiny:128:real:unpad", "tiny:16:full"] if cpu else
            ["base:128:grouped", "base:128:real:unpad", "base:128:full:regional",
             "mini:128:full", "tiny:128:full", "base:512:full"])
    results["3 rows"] = phase("phase 3: other rows", [*throughput, "--append", "--rows", *rest],
                              110, log)
    profiled = "tiny:128:full" if cpu else "base:128:full"
    results["4 profile"] = phase("phase 4: profile", [*throughput, "--append", "--rows",
                                                      "--profile", profiled, "--no-reference"],
                                 40, log)
    verdict = "phases: " + ", ".join(f"{k} {'done' if v else 'NOT finished'}"
                                     for k, v in results.items())
    print(verdict)
    with open(log, "a") as out:  # and in the log that comes back, for `receive` to read
        out.write(verdict + "\n")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
