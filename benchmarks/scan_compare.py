#!/usr/bin/env python
"""torchless scan against picklescan, modelscan and fickling on the same files: misses, false
alarms, files per second.

Usage::

    python3 -m venv /work/venv-scanpeers
    /work/venv-scanpeers/bin/pip install picklescan modelscan fickling typing_extensions
    python benchmarks/scan_compare.py /work/venv-scanpeers
    python benchmarks/scan_compare.py VENV --hostile /tmp/hostile --extra DIR --json
    python benchmarks/scan_compare.py VENV --labelled-only   # the labelled set alone
    python benchmarks/scan_compare.py VENV --throughput      # files/s on fixtures + corpus
    python benchmarks/scan_compare.py VENV --throughput --whole-process  # and whole processes
    python benchmarks/scan_compare.py VENV --throughput --whole-process --rounds 11
    python benchmarks/scan_compare.py "$VIRTUAL_ENV" --quick   # a few files: a smoke run

The files and what each must get (the labels come from the hostile manifest, the corpus
provenance and REFERENCE.json, never from a scanner):

* the generated hostile set (``../shared/hostile/make_hostile.py``, written to a temporary
  directory unless ``--hostile DIR`` holds one): *payloads* (categories code-exec and gadget,
  or an UnsafeGlobalError hint) and *bypasses* (category scanner-bypass, or a marker payload in
  a case to reject) must be flagged; the ``read-safely`` cases must not;
* ``../shared/hostile/corpus``: the picklescan and modelscan malicious samples must be flagged;
  their benign controls and ziplinter's ``test.zip`` must not;
* every checkpoint in ``../shared/fixtures`` (REFERENCE.json) must not be flagged;
* ``--extra DIR`` (repeatable): another make_hostile-style directory (``manifest.json`` +
  ``cases/``), graded like the hostile set;
* the labelled set of ``tests/scanner/labelled``: the dangerous files ``make_dangerous.py``
  writes (each confirmed by torch.load in ``tests/scanner/test_labelled.py``) must be
  flagged, the real library files of ``tests/data/labelled/benign`` must not.

fickling is run as its own API says: ``scan_zip_archive`` for a ZIP (the members named
``.pkl``/``.bin``), ``scan_file(graceful=True)`` otherwise; a file is flagged when a result is
not ``is_safe`` (severity above LIKELY_SAFE).

``--throughput`` times each tool over the repo's fixtures and corpus and the shared fixtures
(the real checkpoints, 5 interleaved rounds or ``--rounds N``, median), in files per second
of wall time and of the scanning thread's CPU time, each tool (torchless too) in a fresh
process per round. With ``--whole-process`` it then times whole processes on the same
files, interpreter start and imports included: ``python -m torchless scan FILES...`` (the
command a user runs, its report printed to /dev/null) against one picklescan process that imports
``picklescan.scanner`` and calls ``scan_file_path`` on each file (its command line takes one
path), median of the same number of interleaved rounds, wall time and the child's CPU time.
Every process of either table runs with bytecode caching on (``PYTHONDONTWRITEBYTECODE``
dropped from its environment) after one untimed warm-up process per tool, so that neither
tool's imports are timed compiling source: an installed package has its ``.pyc`` files.

Each tool scans one file at a time through its Python API in one process (picklescan's
``scan_file_path``; modelscan's ``ModelScan().scan``; ``torchless.scan``), so interpreter start
is not counted; ``seconds`` is the sum over all files. Outcomes per file: ``flagged``
(picklescan: a dangerous global; modelscan: any issue; torchless: exit code 1, a dangerous
global or an anomaly), ``error`` (the tool could not scan it: picklescan scan error or nothing
scanned, modelscan errors or nothing scanned, torchless exit code 2), or ``clean``. A *miss* is
a must-flag file reported clean; an *unscanned* one is a must-flag file the tool gave up on
(an error the caller may or may not treat as a failure); a *false alarm* is a must-not-flag
file flagged. A scanner that VENV's interpreter cannot import is reported as ``not installed``
(in the table, and as that string in place of its outcomes with ``--json``).

``--quick`` generates only the hostile cases whose id contains ``tar_`` (no torch controls)
and grades at most 3 files of each kind (to flag, not to flag) per set: it checks that the
comparison runs, in seconds; its counts mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
CHECKPOINT_MAGICS = {"zip", "pickle", "tar", "4c31313935343730"}
NOT_INSTALLED = "not installed"
#: --quick: make_hostile.py --only this (a few payloads and a benign TAR, all cheap to write),
#: and at most this many files of each kind per set.
QUICK_ONLY = "tar_"
QUICK_LIMIT = 3

#: Corpus samples that are not payloads, and those graded neither way.
CORPUS_BENIGN = {
    "picklescan/data/benign0_v0.pkl", "picklescan/data/benign0_v3.pkl",
    "picklescan/data/benign0_v4.pkl", "picklescan/data/new_pytorch_model.bin",
    "picklescan/data/pytorch_model.bin", "ziplinter/test.zip",
}
CORPUS_UNGRADED = {
    "picklescan/data/benign_password_protected.zip", "picklescan/data/bad_pytorch.pt",
    "picklescan/data/not_a_pickle.bin", "modelscan/password_protected.zip",
}

_FOREIGN = r'''
import json, os, sys, time, pathlib, logging, warnings, zipfile
logging.disable(logging.CRITICAL)
warnings.simplefilter("ignore")
tool = sys.argv[1]
paths = json.load(sys.stdin)
out = []
result, sys.stdout = sys.stdout, open(os.devnull, "w")  # tools that print
try:
    __import__({"picklescan": "picklescan.scanner", "modelscan": "modelscan.modelscan",
                "fickling": "fickling", "torchless": "torchless.scanner.files"}[tool])
except ImportError as e:
    json.dump({"not_installed": str(e)}, result)
    sys.exit(0)
if tool == "fickling":
    import fickling
    def run(p):
        if zipfile.is_zipfile(p):
            results = list(fickling.scan_zip_archive(p, graceful=True).values())
        else:
            results = [fickling.scan_file(p, graceful=True)]
        if any(not r.is_safe for r in results):
            return "flagged"
        return "error" if any(r.errors for r in results) or not results else "clean"
elif tool == "torchless":
    from torchless.scanner.files import scan
    def run(p):
        return {0: "clean", 1: "flagged"}.get(scan(p).exit_code, "error")
elif tool == "picklescan":
    from picklescan.scanner import scan_file_path
    def run(p):
        r = scan_file_path(p)
        if r.issues_count:
            return "flagged"
        return "error" if r.scan_err or not r.scanned_files else "clean"
else:
    from modelscan.modelscan import ModelScan
    def run(p):
        r = ModelScan().scan(pathlib.Path(p))
        if r["summary"]["total_issues"]:
            return "flagged"
        if r.get("errors") or not r["summary"]["scanned"]["total_scanned"]:
            return "error"
        return "clean"
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1
for r in range(rounds):
    for p in paths:
        t, c = time.perf_counter(), time.thread_time()
        try:
            outcome = run(p)
        except BaseException as e:  # a crash of the tool is an error, not a verdict
            outcome = "error"
        out.append([p, outcome, time.perf_counter() - t, time.thread_time() - c])
json.dump(out, result)
'''
TOOLS = ("picklescan", "modelscan", "fickling")


def expectation(case: dict[str, Any]) -> str:
    """'flag', 'clean' or 'other' for a make_hostile manifest entry (as tests/scanner/test_scan.py
    does)."""
    if case["category"] in ("code-exec", "gadget", "scanner-bypass") or \
            case.get("error_class_hint") == "UnsafeGlobalError" or \
            (case.get("marker") and case["expected"] == "reject"):
        return "flag"
    return "clean" if case["expected"] == "read-safely" else "other"


def scan_set(dangerous: Path) -> list[tuple[str, str, str]]:
    """The labelled scan set: ``make_dangerous.py`` output in ``dangerous`` and the committed
    real library files."""
    subprocess.run([sys.executable, str(REPO / "tests" / "scanner" / "labelled" /
                                        "make_dangerous.py"), str(dangerous)], check=True)
    out = [("labelled", str(dangerous / c["file"]), "flag")
           for c in json.loads((dangerous / "manifest.json").read_text())["cases"]]
    benign = REPO / "tests" / "data" / "labelled" / "benign"
    out += [("labelled", str(benign / c["file"]), "clean")
            for c in json.loads((benign / "manifest.json").read_text())["cases"]]
    return out


def throughput_files() -> list[str]:
    """Real checkpoints: the repo's fixtures and corpus and the shared fixtures."""
    out = []
    for root in (REPO / "tests" / "data" / "fixtures", REPO / "tests" / "data" / "corpus"):
        out += [str(p) for p in sorted(root.rglob("*")) if p.is_file()
                and p.suffix not in (".md", ".json")]
    fixtures = SHARED / "fixtures"
    reference = json.loads((fixtures / "REFERENCE.json").read_text())
    out += [str(fixtures / rel) for rel, ref in sorted(reference.items())
            if ref["magic"] in CHECKPOINT_MAGICS]
    return out


def labelled_files(hostile: list[Path], limit: int | None = None) -> list[tuple[str, str, str]]:
    """(set name, path, 'flag' | 'clean') for every graded file (with ``limit``: only the first
    ``limit`` of each kind in each set)."""
    out: list[tuple[str, str, str]] = []
    for root in hostile:
        manifest = json.loads((root / "manifest.json").read_text())
        for case in manifest["cases"]:
            want = expectation(case)
            if want != "other":
                out.append((root.name, str(root / case["file"]), want))
    corpus = SHARED / "hostile" / "corpus"
    for path in sorted(corpus.rglob("*")):
        rel = path.relative_to(corpus).as_posix()
        if not path.is_file() or rel.endswith(".md") or rel in CORPUS_UNGRADED:
            continue
        if rel in CORPUS_BENIGN:
            out.append(("corpus", str(path), "clean"))
        elif rel.startswith(("picklescan/", "modelscan/")):
            out.append(("corpus", str(path), "flag"))
    fixtures = SHARED / "fixtures"
    reference = json.loads((fixtures / "REFERENCE.json").read_text())
    for rel, ref in sorted(reference.items()):
        if ref["magic"] in CHECKPOINT_MAGICS:
            out.append(("fixtures", str(fixtures / rel), "clean"))
    if limit is not None:
        seen: Counter[tuple[str, str]] = Counter()
        limited = []
        for name, file, want in out:
            seen[name, want] += 1
            if seen[name, want] <= limit:
                limited.append((name, file, want))
        out = limited
    return out


def run_torchless(paths: list[str], rounds: int = 1) -> dict[str, tuple[str, float]]:
    from torchless.scanner.files import scan

    out: dict[str, tuple[str, float]] = {}
    for _ in range(rounds):
        for p in paths:
            t = time.perf_counter()
            code = scan(p).exit_code
            out[p] = ({0: "clean", 1: "flagged"}.get(code, "error"), time.perf_counter() - t)
    return out


def venv_python(venv: Path) -> Path:
    for name in ("python", "python3"):
        if (venv / "bin" / name).is_file():
            return venv / "bin" / name
    raise SystemExit(f"{venv} has no bin/python: give the venv the scanners are installed in")


def run_foreign(venv: Path, tool: str, paths: list[str],
                rounds: int = 1) -> dict[str, tuple[str, float]] | None:
    """Per-file (outcome, seconds) of ``tool`` run by VENV's interpreter (the last of
    ``rounds``); None if that interpreter cannot import it."""
    got = _runner(venv_python(venv), tool, paths, rounds)
    return None if got is None else {p: (outcome, wall) for p, outcome, wall, _ in got}


def _runner(python: Path | str, tool: str, paths: list[str],
            rounds: int = 1) -> list[list[Any]] | None:
    """[path, outcome, wall seconds, CPU seconds] per file and round of ``tool``, run by
    ``python`` in a process of its own; None if that interpreter cannot import it."""
    with tempfile.TemporaryDirectory() as cwd:  # tools that write reports write them here
        cp = subprocess.run([str(python), "-c", _FOREIGN, tool, str(rounds)],
                            input=json.dumps(paths), capture_output=True, text=True, cwd=cwd,
                            check=False, timeout=3600, env=_cached_env())
    if cp.returncode:
        raise SystemExit(f"{tool} runner failed: {cp.stderr[-2000:]}")
    got = json.loads(cp.stdout)
    if isinstance(got, dict) and "not_installed" in got:
        return None
    assert isinstance(got, list)
    return got


def _cached_env() -> dict[str, str]:
    """This environment with bytecode caching on (an installed package has its .pyc files;
    a tool timed compiling its source would be timed for what no user waits for)."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


_PICKLESCAN_PROCESS = (
    "import logging, sys\n"
    "logging.disable(logging.CRITICAL)\n"
    "from picklescan.scanner import scan_file_path\n"
    "for p in sys.argv[1:]:\n"
    "    scan_file_path(p)\n")


def _whole_commands(venv: Path, paths: list[str]) -> dict[str, list[str]]:
    """The whole-process command of each tool over ``paths`` (see the module docstring)."""
    return {"torchless": [sys.executable, "-m", "torchless", "scan", *paths],
            "picklescan": [str(venv_python(venv)), "-c", _PICKLESCAN_PROCESS, *paths]}


def _timed_process(cmd: list[str]) -> tuple[float, float] | None:
    """(wall seconds, CPU seconds) of one run of ``cmd``, output to /dev/null; None if it
    failed to start its tool (exit code other than a scan verdict's 0, 1, 2)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as cwd:
        cp = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd,
                            env=_cached_env(), check=False, timeout=3600)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cp.returncode not in (0, 1, 2):
        return None
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _print_rates(files: int, wall: dict[str, list[float]], cpu: dict[str, list[float]]) -> None:
    """The table of median seconds, files per second and ratios to torchless, wall and CPU."""
    print("| scanner | seconds | files/s | time vs torchless | CPU seconds | CPU files/s | "
          "CPU vs torchless |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    ours, ours_cpu = statistics.median(wall["torchless"]), statistics.median(cpu["torchless"])
    for tool, runs in wall.items():
        if not runs:
            print(f"| {tool} | {NOT_INSTALLED} | | | | | |")
            continue
        med, med_cpu = statistics.median(runs), statistics.median(cpu[tool])
        print(f"| {tool} | {med:.3f} | {files / med:.0f} | {med / ours:.2f}x | "
              f"{med_cpu:.3f} | {files / med_cpu:.0f} | {med_cpu / ours_cpu:.2f}x |")


def whole_process(venv: Path, paths: list[str], rounds: int = 5) -> None:
    """Whole processes (start and imports included) of torchless and picklescan over
    ``paths``: ``rounds`` interleaved rounds after one warm-up each, the medians."""
    commands = _whole_commands(venv, paths)
    for cmd in commands.values():
        _timed_process(cmd)  # warm-up: bytecode written, files in the page cache
    wall: dict[str, list[float]] = {t: [] for t in commands}
    cpu: dict[str, list[float]] = {t: [] for t in commands}
    for _ in range(rounds):
        for tool, cmd in commands.items():
            got = _timed_process(cmd)
            if got is not None:
                wall[tool].append(got[0])
                cpu[tool].append(got[1])
    print(f"\nWhole process on the same {len(paths)} files, median of {rounds} interleaved "
          "rounds, interpreter start and imports included (torchless: `python -m torchless "
          "scan FILES...`; picklescan: one process importing it and scanning each file)\n")
    _print_rates(len(paths), wall, cpu)


def throughput(venv: Path, rounds: int = 5, whole: bool = False) -> int:
    """Files per second of each tool on real checkpoints: ``rounds`` interleaved rounds, each
    tool once per round in a process of its own (torchless too, run by this interpreter,
    through the same timing loop), the median round. Wall time is what a user waits for; on
    a shared machine it also counts the time other processes hold the CPU, so the CPU time
    of the scanning thread is given beside it."""
    paths = throughput_files()
    wall: dict[str, list[float]] = {t: [] for t in ("torchless", *TOOLS)}
    cpu: dict[str, list[float]] = {t: [] for t in wall}
    for tool in wall:  # warm-up, untimed: bytecode written, files in the page cache
        _runner(sys.executable if tool == "torchless" else venv_python(venv), tool, paths)
    for _ in range(rounds):
        for tool in wall:
            got = _runner(sys.executable if tool == "torchless" else venv_python(venv), tool,
                          paths)
            if got is not None:
                wall[tool].append(sum(row[2] for row in got))
                cpu[tool].append(sum(row[3] for row in got))
    print(f"{len(paths)} real checkpoint files (repo fixtures + corpus, shared fixtures), "
          f"median of {rounds} interleaved rounds, each tool in a process of its own, "
          "interpreter start excluded\n")
    _print_rates(len(paths), wall, cpu)
    if whole:
        whole_process(venv, paths, rounds)
    return 0


def generate(out: Path, only: str | None = None) -> Path:
    cmd = [sys.executable, str(SHARED / "hostile" / "make_hostile.py"), "--out", str(out)]
    if only is not None:
        cmd += ["--only", only]  # and no torch controls: none has a quick id
    else:
        try:
            import torch  # noqa: F401

            cmd += ["--torch-benign", sys.executable]
        except ImportError:
            pass
    subprocess.run(cmd, check=True, capture_output=True, cwd=out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("venv", type=Path,
                    help="venv with picklescan and modelscan installed (a scanner its python "
                         "cannot import is reported as 'not installed')")
    ap.add_argument("--hostile", type=Path, help="an existing make_hostile.py output directory")
    ap.add_argument("--extra", type=Path, action="append", default=[],
                    help="another make_hostile-style directory to grade (repeatable)")
    ap.add_argument("--json", action="store_true", help="print per-file outcomes as JSON")
    ap.add_argument("--labelled-only", action="store_true",
                    help="grade only the labelled scan set (tests/scanner/labelled)")
    ap.add_argument("--throughput", action="store_true",
                    help="files per second of each tool on real checkpoints, then exit")
    ap.add_argument("--whole-process", action="store_true",
                    help="with --throughput: also time whole processes (interpreter start and "
                         "imports included) of torchless and picklescan on the same files")
    ap.add_argument("--rounds", type=int, default=5,
                    help="with --throughput: interleaved rounds of each table (default 5; "
                         "more on a busy machine)")
    ap.add_argument("--quick", action="store_true",
                    help=f"a smoke run in seconds: only the hostile cases whose id contains "
                         f"{QUICK_ONLY!r}, at most {QUICK_LIMIT} files of each kind per set "
                         f"(its counts mean nothing)")
    args = ap.parse_args()
    venv_python(args.venv)  # a wrong VENV fails before the scans, not after
    if args.throughput:
        return throughput(args.venv, rounds=args.rounds, whole=args.whole_process)
    with tempfile.TemporaryDirectory() as tmp:
        files = scan_set(Path(tmp) / "labelled")
        if not args.labelled_only:
            hostile = args.hostile or generate(Path(tmp), QUICK_ONLY if args.quick else None)
            files += labelled_files([hostile, *args.extra], QUICK_LIMIT if args.quick else None)
        paths = [p for _, p, _ in files]
        results: dict[str, dict[str, tuple[str, float]] | None] = {
            "torchless": run_torchless(paths)}
        for tool in TOOLS:
            results[tool] = run_foreign(args.venv, tool, paths)
    if args.json:
        json.dump({tool: NOT_INSTALLED if r is None else {p: list(v) for p, v in r.items()}
                   for tool, r in results.items()}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    must = [p for _, p, w in files if w == "flag"]
    benign = [p for _, p, w in files if w == "clean"]
    sets = sorted({s for s, _, _ in files})
    print(f"{len(must)} files to flag, {len(benign)} not to flag "
          f"({', '.join(f'{s}: {sum(1 for x, _, _ in files if x == s)}' for s in sets)})\n")
    print("| scanner | misses (reported clean) | unscanned (error) | false alarms | "
          "errors on benign | seconds |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for tool, r in results.items():
        if r is None:
            print(f"| {tool} |" + f" {NOT_INSTALLED} |" * 5)
            continue
        missed = [p for p in must if r[p][0] == "clean"]
        unscanned = [p for p in must if r[p][0] == "error"]
        false = [p for p in benign if r[p][0] == "flagged"]
        benign_err = [p for p in benign if r[p][0] == "error"]
        seconds = sum(s for _, s in r.values())
        print(f"| {tool} | {len(missed)} | {len(unscanned)} | {len(false)} | "
              f"{len(benign_err)} | {seconds:.2f} |")
    print()
    for tool, r in results.items():
        if r is None:
            print(f"{tool}: {NOT_INSTALLED} in {args.venv}")
            continue
        missed = [os.path.basename(p) for p in must if r[p][0] == "clean"]
        false = [os.path.basename(p) for p in benign if r[p][0] == "flagged"]
        print(f"{tool} misses: {', '.join(missed) or '-'}")
        print(f"{tool} false alarms: {', '.join(false) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
