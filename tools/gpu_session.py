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
  2. the pretraining twins (benchmarks/twins.py train: the gpu recipe's mini, MLM + NSP and
     MLM alone, 2 seeds each), 4 runs at once, about 3 minutes
  3. the other throughput rows, most telling first: base at 128 on BBC batches grouped by
     length (less padding, most batches unmasked), on BBC batches unpadded (the blocks skip the
     padding), compiled layer by layer (is regional compilation as fast?), mini and tiny at
     128, base at 512; added to the record
  4. the profile of base at 128 (top kernels by time), added to gpu_throughput.json
Then each run folder, less its checkpoints, is packed into its own archive under $OUT (each
well under 16 MiB).
The inductor cache lives in .cache/inductor (ignored), so the full call reuses the smoke's.

Back here, with the folder the full call's $OUT came back to:

    python tools/gpu_session.py receive --from FOLDER     # runs/twins-gpu + gpu_throughput.json
    python benchmarks/twins.py score --device cuda --ship gpu-mini=mlm+nsp   # what they learned

`receive` checks everything before it writes anything, and refuses (exit 2, nothing written) a
record or a run made on the CPU, a record the notebooks could not read (no rows, no torch), a
cut archive or one that is no archive, a summary that is not a JSON object, two archives that
would write the same run, and a runs folder that already holds runs; where it writes is checked
too (a path under a file, a file where a folder goes, the --from folder itself, a link leading
nowhere writable, a folder it may not write in). The runs are unpacked into a staging folder
beside --runs, the record is written, and then the runs are put in place in one rename: a
failure or a stop (Ctrl-C, SIGTERM) on the way leaves both as they were, and after kill -9 the
same receive, run again, sweeps the leftovers and finishes.
`--device cpu` walks the same phases on the CPU with tiny sizes (a check of the commands only).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tarfile
import time
import zlib
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
    """Pack each run folder (summary.json, its bf16 model, history, settings and tokenizer; not
    its checkpoints, which hold the optimizer too) into out/<run>.tgz, and the logs into
    out/twins-logs.tgz: files small enough to come back one by one."""
    def no_checkpoints(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if "checkpoints" in Path(member.name).parts else member

    for folder in sorted(p for p in runs.iterdir() if p.is_dir()):
        with tarfile.open(out / f"{folder.name.replace('+', '-')}.tgz", "w:gz") as tar:
            tar.add(folder, arcname=folder.name, filter=no_checkpoints)
    with tarfile.open(out / "twins-logs.tgz", "w:gz") as tar:
        for f in sorted(runs.iterdir()):
            if f.is_file():
                tar.add(f, arcname=f.name)


class Refused(Exception):
    """What `receive` refuses, in one line; it has written nothing."""


def _json_object(data: bytes, name: str) -> dict:
    """Return the JSON object in `data` (the file `name`); refuse anything else."""
    try:
        value = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise Refused(f"{name} is not whole JSON ({e}): it was cut on its way back; fetch the "
                      f"files again") from None
    if not isinstance(value, dict):
        raise Refused(f"{name} holds a JSON {type(value).__name__}, not the object of settings "
                      f"and figures a session writes; fetch the files of a full call again")
    return value


def _check_throughput(record: dict, name: str) -> None:
    """Refuse a throughput record that the notebooks' reader (`throughput_lines`) cannot show."""
    from bertlab.course.gpu_records import throughput_lines
    rows = record.get("rows")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise Refused(f"{name} has no measured rows (rows: {rows!r}): phase 1 did not finish; "
                      f"a record without rows is no measurement")
    for i, row in enumerate(rows):
        # tokens/s must be a measured rate; an MFU may be None (a device whose peak is unknown)
        # but never NaN, inf, zero or negative.
        bad = {k: v for k, v in {"tokens_per_s": row.get("tokens_per_s"),
                                 **{k: row[k] for k in ("mfu", "mfu_measured_peak")
                                    if row.get(k) is not None}}.items()
               if isinstance(v, bool) or not isinstance(v, (int, float))
               or not math.isfinite(v) or v <= 0}
        if bad:
            raise Refused(f"{name} row {i} ({row.get('preset')} @ {row.get('seq_len')}) has "
                          f"{', '.join(f'{k} {v!r}' for k, v in bad.items())}: no measurement "
                          f"(a step that failed or timed nothing); run phase 1 again")
    try:
        throughput_lines(record)
    except (KeyError, TypeError, ValueError) as e:
        raise Refused(f"{name} lacks what the notebooks read ({type(e).__name__}: {e}); it is "
                      f"not a whole record of benchmarks/gpu_throughput.py") from None


def _read_archive(archive: Path) -> tuple[list[tarfile.TarInfo], dict[str, dict]]:
    """Return an archive's members and its summaries, read to the end (a cut one fails here)."""
    summaries = {}
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            for member in members:
                if not (member.isfile() or member.isdir()) or Path(member.name).is_absolute() \
                        or ".." in Path(member.name).parts:
                    raise Refused(f"{archive} holds {member.name!r}, which is not a plain file "
                                  f"inside its run folder")
                data = tar.extractfile(member).read() if member.isfile() else b""
                if member.name.endswith("summary.json"):
                    summaries[f"{archive.name}:{member.name}"] = _json_object(
                        data, f"{archive.name}:{member.name}")
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise Refused(f"{archive} is not a whole .tgz archive ({type(e).__name__}: {e}): it was "
                      f"cut on its way back, or is no archive; fetch it again") from None
    runs = {Path(m.name).parts[0] for m in members if len(Path(m.name).parts) > 1}  # folders
    unsummed = sorted(r for r in runs if f"{r}/summary.json" not in {m.name for m in members})
    if unsummed:
        raise Refused(f"{archive} holds run {', '.join(map(repr, unsummed))} without its "
                      f"summary.json: the run did not finish (a summary is written last), so "
                      f"it is no result; receive the archives of a finished full call")
    return members, summaries


def _check_no_clash(contents: dict[Path, list[tarfile.TarInfo]]) -> None:
    """Refuse archives that would write the same run folder (or file): one would overwrite the
    other's, silently."""
    owner: dict[str, Path] = {}
    for archive, members in contents.items():
        tops = {Path(m.name).parts[0] for m in members if Path(m.name).parts}
        names = [m.name for m in members if m.isfile()]
        if len(names) != len(set(names)):
            twice = next(n for n in names if names.count(n) > 1)
            raise Refused(f"{archive} holds {twice!r} twice; fetch it again")
        for top in sorted(tops):
            if top in owner:
                raise Refused(f"{owner[top].name} and {archive.name} both hold {top!r}: one "
                              f"would overwrite the other's run; receive one of them (move the "
                              f"other copy out of the folder)")
            owner[top] = archive


def _gather(came_back: Path) -> tuple[bytes | None, dict | None,
                                      dict[Path, list[tarfile.TarInfo]]]:
    """Return the throughput record (its bytes, read once, and what they hold) and each
    archive's members, every one checked; refuse anything that is not whole, not a GPU's, or
    that clashes."""
    from bertlab.course.gpu_records import made_on_cpu
    record_path = came_back / "gpu_throughput.json"
    archives = sorted(came_back.glob("*.tgz"))
    if not record_path.is_file() and not archives:
        raise Refused(f"{came_back} holds neither gpu_throughput.json nor run archives (*.tgz); "
                      f"pass the folder the full call's $OUT came back to")
    sources, data, record = {}, None, None
    if record_path.is_file():
        data = record_path.read_bytes()
        record = _json_object(data, str(record_path))
        sources[record_path.name] = record
    contents = {}
    for archive in archives:
        contents[archive], summaries = _read_archive(archive)
        sources.update(summaries)
    unnamed = [name for name, made in sources.items() if not made.get("device")]
    if unnamed:
        raise Refused(f"{', '.join(unnamed)} name(s) no device, which every record and summary "
                      f"of a session says: not whole files of a full call; fetch them again")
    on_cpu = [name for name, made in sources.items() if made_on_cpu(made)]
    if on_cpu:
        raise Refused(f"{', '.join(on_cpu)} came from a CPU walk (device 'cpu'), not a GPU; "
                      f"receive the files of a GPU session's full call")
    if record is not None:
        _check_throughput(record, str(record_path))
    _check_no_clash(contents)
    return data, record, contents


def _check_outputs(came_back: Path, runs: Path | None, results: Path | None) -> None:
    """Refuse, before anything is written, an output that cannot take what came back: a path
    under a file, a file where a folder goes, the --from folder itself, a link that loops or
    leads where nothing can be written, a folder this process may not write in, and a `runs`
    folder that already holds something (an earlier session's runs)."""
    from bertlab.atomic import through_link
    from bertlab.engine.outputs import check_output
    any_kind = ("run", "shards", "hf", "checkpoint", "other")  # what is there: checked below
    try:
        for flag, path in (("--runs", runs), ("--results", results)):
            if path is None:
                continue
            check_output(path, flag, inputs=[("--from", came_back)], folder=True,
                         accept=any_kind)
            target = through_link(path)
            if target != path:  # a link (maybe dangling): where it leads must take it too
                check_output(target, f"{flag} {path} ->", folder=True, accept=any_kind)
    except ValueError as e:
        raise Refused(str(e).removesuffix(" (nothing was written)")) from None
    if runs is not None and runs.exists() and any(runs.iterdir()):
        raise Refused(f"{runs} already holds runs; move it aside (or pass --runs NEW_FOLDER), "
                      f"then receive again")
    if results is not None and (results / "gpu_throughput.json").is_dir():
        raise Refused(f"{results / 'gpu_throughput.json'} is a folder, where the record goes; "
                      f"move it aside, or pass another --results")
    if runs is not None and results is not None:
        real_runs, real_results = (Path(os.path.realpath(p)) for p in (runs, results))
        if real_results == real_runs or real_results.is_relative_to(real_runs):
            raise Refused(f"--results {results} lies in --runs {runs}, which is put in place "
                          f"whole; pass a --results folder outside it")


def _put_in_place(contents: dict[Path, list[tarfile.TarInfo]], record: bytes | None,
                  runs: Path, results: Path) -> None:
    """Unpack every archive into a staging folder beside `runs`, write the record into
    `results`, then rename the staging folder into place. A failure on the way (a full disk,
    Ctrl-C, SIGTERM) leaves both as they were: the staging folder is removed and the record's
    previous content (or its absence) comes back. After kill -9 the next receive sweeps the dead
    one's staging folder; killed after the record was written, it writes the same bytes again."""
    from bertlab.atomic import atomic_write_bytes
    from bertlab.engine.folders import atomic_write_folder
    target = results / "gpu_throughput.json"
    before = target.read_bytes() if target.is_file() else None
    began: list[Path] = []
    # The folders this receive will make, deepest first: a failure removes them again.
    made = [p for p in (results, *Path(os.path.realpath(runs)).parents, *results.parents)
            if not p.exists()]

    def write_record() -> None:
        if record is not None:
            results.mkdir(parents=True, exist_ok=True)
            began.append(target)
            atomic_write_bytes(target, record)

    def fill(staging: Path) -> None:
        for archive in contents:
            with tarfile.open(archive) as tar:  # checked: plain files, no clash between them
                tar.extractall(staging, **({"filter": "data"} if hasattr(tarfile, "data_filter")
                                           else {}))
            print(f"unpacked {archive.name} into {runs}")
        write_record()  # before the rename: once the runs are in place, all is

    try:
        if contents:
            atomic_write_folder(runs, fill)
        else:
            write_record()
    except BaseException:
        now = target.read_bytes() if began and target.is_file() else before
        if now != before:  # the new record was written: the previous one comes back
            atomic_write_bytes(target, before) if before is not None else target.unlink()
        for folder in sorted(set(made), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):  # one that holds something stays
                folder.rmdir()
        raise


def receive(came_back: Path, runs: Path, results: Path) -> int:
    """Unpack what the full call returned: each run archive into `runs` (summary.json and its
    model, with the logs beside them, as `benchmarks/twins.py score` reads them) and
    gpu_throughput.json into `results`. Everything is checked first, what came back and where it
    goes; a refusal writes nothing: a CPU walk's files (they are no GPU result), a record the
    notebooks could not read, a cut or clashing archive, a `runs` folder that already holds runs
    (an earlier session's), an output path under a file, a file where a folder goes, a folder
    that may not be written. A failure or a stop while writing leaves both as they were."""
    # Imported here, not at the top: the GPU machine runs this script without bertlab installed.
    from bertlab.engine.resume import interrupt_on_sigterm
    from bertlab.errors import os_error_line
    log = came_back / "full.log"
    phases = [line for line in (log.read_text(errors="replace").splitlines()
                                if log.is_file() else []) if line.startswith("phases: ")]
    print(phases[-1] if phases else f"no 'phases:' line in {log}: the full call may have been cut")
    try:
        data, record, contents = _gather(came_back)
        _check_outputs(came_back, runs if contents else None,
                       results if record is not None else None)
    except Refused as e:
        print(f"gpu_session receive: {e}; nothing was written")
        return 2
    again = (f"nothing was received ({runs} and {results / 'gpu_throughput.json'} are as they "
             f"were); run the same receive again")
    try:
        with interrupt_on_sigterm():
            _put_in_place(contents, data, runs, results)
    except OSError as e:
        print(f"gpu_session receive: {os_error_line(e).removeprefix('error: ')}; {again} "
              f"once that is fixed")
        return 1
    except KeyboardInterrupt as e:
        signum = int(getattr(e, "signum", signal.SIGINT))
        print(f"gpu_session receive: stopped by {signal.Signals(signum).name}; {again}")
        return 128 + signum
    if record is not None:
        print(f"copied gpu_throughput.json ({record['device']}) into {results}")
    if contents:
        print(f"next: python benchmarks/twins.py score --device cuda --runs {runs} --ship "
              f"gpu-mini=mlm+nsp")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("call", choices=("smoke", "full", "receive"))
    p.add_argument("--from", dest="came_back", type=Path,
                   help="receive: the folder the full call's $OUT came back to")
    p.add_argument("--runs", type=Path, default=ROOT / "runs" / "twins-gpu",
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
    # The gpu recipe's twins, 2 seeds, all 4 at once on the one device (at most 8 files come
    # back, so 4 runs); each evaluated at 128 tokens and on the 64-token shards.
    twins = [PY, "benchmarks/twins.py", "train", "--device", args.device, "--recipe", "gpu",
             "--arms", "mlm+nsp", "mlm", "--seeds", "0", "1", "--jobs", "4", "--preset", "mini",
             "--corpus", str(shards), "--validate-also", str(shards64), "--eval-interval", "250",
             "--eval-batches", "50", "--checkpoint-interval", "none", "--num-workers", "2"]
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
