"""Every benchmark script runs end to end at a tiny size, so the commands the docs quote keep
working (docs/benchmarks.md, the README's footnotes).

Each script runs as ``python benchmarks/X.py --quick …`` from the repository root, with the
interpreter running the tests. The tests check the shape of what it prints: the rows and
columns the docs promise, numbers where the figures go, and the keys of ``--json``. They never
check a figure: the machines are noisy, and at this size the figures mean nothing anyway.
Scripts that need torch skip without it, or fail with TORCHLESS_REQUIRE_TORCH=1 (the ``torch``
fixture); scan_compare.py needs ``../shared`` (the ``shared_dir`` fixture).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
NUMBER = r"\d+(?:\.\d+)?"


def _run(script: str, *args: str) -> str:
    """Run a benchmark script from the repository root; return its stdout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"),
                                         *filter(None, [env.get("PYTHONPATH")])])
    cp = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=600, check=False)
    assert cp.returncode == 0, f"{script} {' '.join(args)}: exit {cp.returncode}\n{cp.stderr}"
    assert "Traceback" not in cp.stderr, cp.stderr
    return cp.stdout


@contextlib.contextmanager
def _module(script: str) -> Iterator[ModuleType]:
    """The script imported in this process (to render a table from its --json results); the
    path and module it adds for its own imports are taken away again afterwards."""
    name = f"_benchmark_{script}"
    saved, had = sys.path[:], set(sys.modules)
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{script}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path[:] = saved
        for added in (name, "bench_read"):  # convert.py imports bench_read by that name
            if added not in had:
                sys.modules.pop(added, None)


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and math.isfinite(v)


# ---- bench_read.py ----------------------------------------------------------------------

READ_FILES = ("big", "many", "legacy")


def _read_rows(table: str) -> dict[tuple[str, str, str], list[str]]:
    """The measurement rows of bench_read's table: (file, op, reader) -> the other columns."""
    rows = {}
    for line in table.splitlines():
        cols = line.split()
        if len(cols) == 13 and cols[0] in READ_FILES and cols[1] in ("list", "read"):
            rows[cols[0], cols[1], cols[2]] = cols[3:]
    return rows


def _check_read_header(table: str) -> None:
    head = next(line for line in table.splitlines() if "median s" in line).split()
    assert head == ["file", "op", "reader", "median", "s", "min", "s", "max", "s", "tl/this",
                    "xcopy", "base", "MiB", "peak", "MiB", "+op", "MiB", "anon", "MiB",
                    "file", "MiB"]


def test_bench_read_with_torch(torch: ModuleType) -> None:
    """--json: every reader on every file, agreeing; the ratios against torch are numbers."""
    # the built-in writer saves the generator's torch import; torch must read its files too
    results = json.loads(_run("bench_read.py", "--quick", "--writer", "builtin", "--json"))
    assert {"environment", "config", "files", "imports", "runs", "notes", "summary",
            "problems"} <= results.keys()
    assert results["problems"] == []
    assert results["config"]["reps"] == 1 and results["config"]["big_mib"] == 1
    assert results["environment"]["torch"] is not None
    assert set(results["files"]) == set(READ_FILES)
    for info in results["files"].values():
        assert all(_positive(info[k]) for k in ("tensors", "tensor_bytes", "file_bytes"))
    assert set(results["imports"]) == {"plain", "torch", "torchless", "dropin"}
    assert all(v["import_s"] >= 0 for v in results["imports"].values())

    want = {(f, op, r) for f in READ_FILES for op in ("list", "read")
            for r in ("torchless", "torch-mmap", "torch", "dropin", "dropin-mmap", "copy")
            if not (r == "copy" and op == "list")
            and not (r in ("torch-mmap", "dropin-mmap") and f == "legacy")}
    summary = {(row["file"], row["op"], row["reader"]): row for row in results["summary"]}
    assert set(summary) == want
    for (_, op, reader), row in summary.items():
        assert row["n"] == 1
        assert all(_positive(row[k]) for k in ("median", "min", "max", "peak_mib")), row
        if reader in ("torch", "torch-mmap", "dropin", "dropin-mmap"):
            assert _positive(row["torchless_over_this"]), row
        else:
            assert row["torchless_over_this"] is None
        if op == "read" and reader != "copy":
            assert _positive(row["over_copy"]), row
        else:
            assert row["over_copy"] is None
    runs = [r for r in results["runs"] if r["reader"] != "copy"]
    assert runs and all(r["count"] == results["files"][r["file"]]["tensors"] for r in runs)

    # the table the same results print: a torch row has its ratio in the tl/this column
    with _module("bench_read") as bench_read:
        table = bench_read.table(results)
    _check_read_header(table)
    rows = _read_rows(table)
    assert set(rows) == want
    for (_, op, reader), cols in rows.items():
        assert all(re.fullmatch(NUMBER, c) for c in cols[:3]), cols  # median, min, max
        tl_this, xcopy = cols[3], cols[4]
        if reader in ("torch", "torch-mmap", "dropin", "dropin-mmap"):
            assert re.fullmatch(NUMBER, tl_this), cols
        else:
            assert tl_this == "-", cols
        if op == "read" and reader != "copy":
            assert re.fullmatch(NUMBER, xcopy), cols
        else:
            assert xcopy == "-", cols


def test_bench_read_without_torch() -> None:
    """--no-torch (what a machine without torch runs): torchless and the copy floor only."""
    out = _run("bench_read.py", "--quick", "--no-torch")
    assert re.search(r"^  torch +absent$", out, re.M)
    assert "isolation      fork; 1 repetitions" in out
    assert "written by builtin" in out
    assert "note: torch is not installed (or --no-torch)" in out
    assert re.search(r"^whole run: \d+ s$", out, re.M)
    _check_read_header(out)
    rows = _read_rows(out)
    assert set(rows) == {(f, op, "torchless") for f in READ_FILES for op in ("list", "read")} \
        | {(f, "read", "copy") for f in READ_FILES}
    for (_, op, reader), cols in rows.items():
        assert all(re.fullmatch(NUMBER, c) for c in cols[:3]), cols
        assert cols[3] == "-"  # no torch to compare with
        if op == "read" and reader == "torchless":
            assert re.fullmatch(NUMBER, cols[4]), cols
        else:
            assert cols[4] == "-", cols


# ---- dcp_convert.py ---------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["dcp", "zero3"])
def test_dcp_convert(torch: ModuleType, capsys: pytest.CaptureFixture[str], layout: str) -> None:
    """A DCP checkpoint (or a DeepSpeed ZeRO-3 run) written by two processes, consolidated
    three ways: every method has its median seconds and peak RSS, and the ratios and targets
    the docs quote are there."""
    if layout != "dcp":
        require("deepspeed")
    results = json.loads(_run("dcp_convert.py", "--quick", "--json", "--layout", layout))
    assert results["layout"] == layout
    methods = ("torchless", "torchless-nofsync", "torch", "cp")
    assert set(results["median"]) == set(methods)
    for m in methods:
        assert all(_positive(results["median"][m][k]) for k in ("seconds", "process", "rss"))
        assert len(results["samples"][m]) == 1
    assert _positive(results["bytes"])
    assert set(results["ratios"]) == {"torchless/cp", "torchless-nofsync/cp",
                                      "torch/torchless-nofsync", "torch rss/torchless rss"}
    cap = 100 if layout == "dcp" else 64
    assert set(results["targets"]) == {"<= 1.5x cp (page cache: nofsync vs cp)",
                                       f"peak RSS <= {cap} MiB"}
    with _module("dcp_convert") as mod:
        mod.print_results(results, as_json=False)
    table = capsys.readouterr().out
    for m in methods:
        assert re.search(rf"^{re.escape(m)} +{NUMBER} +{NUMBER} +{NUMBER} \w+ ", table, re.M)


# ---- convert.py -------------------------------------------------------------------------

CONVERT_METHODS = ("torchless", "torchless-nofsync", "floor", "floor-nofsync", "c-pickle", "cp",
                   "cp+sync", "torch")


def test_convert(torch: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    """--json: every method's medians, the ratios and the targets, the start-up timings; then
    the table they print. One file (bf16: many tensors of mixed sizes) keeps it to one torch
    child; no peers (they need their own environment)."""
    results = json.loads(_run("convert.py", "--quick", "--files", "bf16", "--json",
                              "--methods", ",".join(CONVERT_METHODS)))
    assert set(results) == {"files", "startup"} and set(results["files"]) == {"bf16-1M"}
    r = results["files"]["bf16-1M"]
    assert {"bytes", "median", "samples", "ratios", "targets", "failed"} <= r.keys()
    assert _positive(r["bytes"]) and r["failed"] == {}
    assert set(r["median"]) == set(CONVERT_METHODS)
    for method in CONVERT_METHODS:
        assert len(r["samples"][method]) == 1
        assert all(_positive(r["median"][method][k]) for k in ("seconds", "op", "rss"))
    assert set(r["ratios"]) == {"torchless/cp+sync", "torchless/floor", "torchless-nofsync/cp",
                                "torchless-nofsync/floor-nofsync", "torchless/c-pickle",
                                "c-pickle/floor", "torch/torchless-nofsync"}
    assert all(_positive(v) for v in r["ratios"].values())
    assert set(r["targets"]) == {"<= 1.15x cp+sync", "<= 1.3x floor", "peak RSS <= 64 MiB"}
    assert all(isinstance(v, bool) for v in r["targets"].values())
    st = results["startup"]
    assert set(st["median"]) == {"python -c pass", "import numpy", "torchless --version",
                                 "torchless inspect tiny.pt"}
    assert all(_positive(v) for v in st["median"].values()) and st["ratio"]["import numpy"] == 1

    with _module("convert") as convert:
        capsys.readouterr()
        convert.print_results(results, False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["file", "method", "seconds", "op", "peak", "RSS", "GB/s"]
    n = len(CONVERT_METHODS)
    for line, method in zip(lines[1:n + 1], CONVERT_METHODS, strict=True):
        cols = line.split()
        assert len(cols) == 7 and cols[:2] == ["bf16-1M", method], cols
        assert all(re.fullmatch(NUMBER, c) for c in (cols[2], cols[3], cols[4], cols[6])), cols
        assert cols[5] in ("B", "KiB", "MiB", "GiB"), cols
    ratios, targets = lines[n + 1], lines[n + 2]
    assert ratios.startswith("bf16-1M ")
    for name in r["ratios"]:
        assert re.search(re.escape(name) + rf" {NUMBER}x(,|$)", ratios), ratios
    assert targets.startswith("bf16-1M ") and len(
        re.findall(r": (?:yes|NO)(?:, |$)", targets)) == 3, targets
    startup = lines[n + 3:]
    assert startup[0] == "" and startup[1].split()[:2] == ["start-up", "(whole"]
    assert [line.rsplit(None, 3)[0] for line in startup[2:6]] == list(st["median"])
    assert len(re.findall(r": (?:yes|NO)(?:, |$)", startup[6])) == 2, startup


def test_bench_modules(torch: ModuleType) -> None:
    """bench_modules.py --json: a row per file and reader with its first and warm times;
    then the table, each row's ratio to torch's (torch's own 1.00x)."""
    r = json.loads(_run("bench_modules.py", "--quick", "--json"))
    assert r["modules"] > 100 and r["tensors"] > 100 and r["reps"] == 1
    readers = ("torch", "torchless-open", "torchless-load")
    assert [(row["file"], row["reader"]) for row in r["rows"]] == [
        (f, reader) for f in ("whole module", "state dict") for reader in readers]
    assert all(_positive(row[k]) for row in r["rows"]
               for k in ("first_cpu", "first_seconds", "warm_cpu", "warm_seconds", "bytes"))
    lines = _run("bench_modules.py", "--quick").splitlines()
    assert re.match(r"[\d,]+ modules, [\d,]+ tensors; medians of 1 interleaved runs", lines[0])
    rows = [line.split(" | ") for line in lines[4:]]
    assert [(c[0].lstrip("| "), c[1]) for c in rows] == [
        (f, reader) for f in ("whole module", "state dict") for reader in readers]
    for cols in rows:
        assert all(re.fullmatch(rf"{NUMBER} s", c) for c in cols[2:6]), cols
        assert all(re.fullmatch(rf"{NUMBER}x", c.rstrip(" |")) for c in cols[6:8]), cols
        if cols[1] == "torch":
            assert cols[6] == "1.00x" and cols[7].rstrip(" |") == "1.00x", cols


def test_cast_convert(torch: ModuleType) -> None:
    """cast_convert.py --json: every method's medians, the ratios and the targets of issue
    28; then the table, for two of the methods."""
    r = json.loads(_run("cast_convert.py", "--quick", "--json"))
    methods = ("torchless", "torchless-nofsync", "cp", "cp+sync", "torch", "read", "cast")
    assert set(r["median"]) == set(methods) and set(r["samples"]) == set(methods)
    assert all(_positive(r["median"][m][k]) for m in methods for k in ("seconds", "rss"))
    assert all(r["median"][m][k] >= 0 for m in methods for k in ("op", "cpu"))
    assert r["output_bytes"] < r["source_bytes"]  # bfloat16: about half
    assert set(r["ratios"]) == {"torchless/cp+sync", "torchless-nofsync/cp",
                                "torch/torchless-nofsync", "torch/torchless",
                                "read op/cp", "cast op/cp"}
    assert all(v >= 0 for v in r["ratios"].values())
    assert set(r["targets"]) == {"torchless <= 1.2x cp+sync", "torchless-nofsync <= 1.2x cp",
                                 "peak RSS <= 64 MiB"}
    lines = _run("cast_convert.py", "--quick", "--methods", "torchless-nofsync,cp").splitlines()
    assert lines[0].startswith("f32 ") and " -> bf16 " in lines[0]
    assert lines[1].split() == ["method", "seconds", "op", "CPU", "peak", "RSS"]
    for line, method in zip(lines[2:4], ("torchless-nofsync", "cp"), strict=True):
        cols = line.split()
        assert cols[0] == method and all(re.fullmatch(NUMBER, c) for c in cols[1:5]), cols
    assert re.fullmatch(rf"ratios: torchless-nofsync/cp {NUMBER}x", lines[4]), lines[4]
    assert re.fullmatch(r"targets: torchless-nofsync <= 1.2x cp: (yes|NO)", lines[5]), lines[5]


def test_convert_c_pickle_bound(torch: ModuleType, tmp_path: Path) -> None:
    """The c-pickle bound converts: its output holds torch's tensors under their names (a
    bound that skipped work would measure nothing). Its child runs on a file of the
    benchmark's three kinds of tensor (float32 matrices, bfloat16, many small float32)."""
    from safetensors.torch import load_file

    tensors = {"a.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4),
               "b": torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16),
               **{f"state.{i}.exp_avg": torch.full((7,), float(i)) for i in range(40)}}
    src, dst = tmp_path / "src.pt", tmp_path / "out.safetensors"
    torch.save(tensors, src)
    with _module("convert") as convert:
        argv = convert._child_argv("c-pickle", str(src), str(dst), None)
    cp = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert cp.returncode == 0, cp.stderr
    assert _positive(json.loads(cp.stdout)["seconds"])
    got = load_file(str(dst))
    assert set(got) == set(tensors)
    for name, t in tensors.items():
        g = got[name]
        assert g.dtype == t.dtype and g.shape == t.shape, name
        assert g.view(torch.uint8).flatten().tolist() == t.view(torch.uint8).flatten().tolist()


# ---- copy_methods.py --------------------------------------------------------------------


def test_copy_methods() -> None:
    """Every copy method's row for the one size, and the same in --json."""
    methods = ("map", "copy_file_range", "copy_file_range+writeback", "sendfile", "gather",
               "sendfile-pieces")
    lines = _run("copy_methods.py", "--quick").splitlines()
    assert lines[0].split() == ["size", "method", "seconds", "peak", "RSS", "x",
                                "copy_file_range"]
    assert len(lines) == 1 + len(methods)
    for line, method in zip(lines[1:], methods, strict=True):
        cols = line.split()
        assert cols[:3] == ["1", "MiB", method] and len(cols) == 7, cols
        assert all(re.fullmatch(NUMBER, c) for c in (cols[3], cols[4], cols[6])), cols
    results = json.loads(_run("copy_methods.py", "--quick", "--sync", "--json"))
    assert set(results) == {"1 MiB"} and set(results["1 MiB"]) == set(methods)
    assert all(_positive(v["rss"]) and v["seconds"] >= 0 for v in results["1 MiB"].values())


# ---- compare_readers.py -----------------------------------------------------------------


def test_compare_readers(torch: ModuleType) -> None:
    out = _run("compare_readers.py", "--quick", "--jobs", "2", "--save-paths")
    m = re.match(r"(\d+) checkpoints that torch\.load\(weights_only=False\) reads\n"
                 r"  torch\.load\(weights_only=True\) reads (\d+), refuses (\d+)\n"
                 r"  torchless\.load reads (\d+), refuses (\d+)\n"
                 r"  read by torchless but refused by weights_only=True: (\d+)\n", out)
    assert m, out
    n, wo_ok, wo_no, tl_ok, tl_no, only_tl = map(int, m.groups())
    assert n == 2  # --quick: one fixture and one corpus checkpoint
    assert wo_ok + wo_no == n and tl_ok + tl_no == n and only_tl <= min(wo_no, tl_ok)
    refusals = re.findall(r"^    weights_only refusal x(\d+): \S", out, re.M)
    assert sum(map(int, refusals)) == wo_no  # every refusal has its reason (8 at most)
    saved = re.search(r"^(\d+) files written by the save paths of torch's test_serialization"
                      r"\.py\n  torch\.load\(weights_only=True\) reads (\d+), refuses (\d+)\n"
                      r"  torchless\.open reads (\d+) \((\d+) with sparse, quantized, nested "
                      r"or meta tensors as records of their parts, (\d+) with tensor kinds it "
                      r"lists as unsupported\), refuses (\d+)\n", out, re.M)
    assert saved, out
    s_n, s_wo_ok, s_wo_no, s_ok, s_records, s_listed, s_no = map(int, saved.groups())
    assert s_n == 4 and s_wo_ok + s_wo_no == s_n and s_ok + s_no == s_n
    assert s_records + s_listed <= s_ok
    assert len(re.findall(r"^  torchless refuses ", out, re.M)) == tl_no + s_no


# ---- corpus/generate.py + corpus/measure.py ---------------------------------------------


def test_corpus_generate_and_measure(torch: ModuleType, tmp_path: Path) -> None:
    """The corpus commands on the two generators that need torch alone (the others need the
    corpus venv's libraries): the manifest, the table's rows and columns, the --json keys."""
    out = tmp_path / "corpus"
    gen = _run("corpus/generate.py", str(out), "--seeds", "1",
               "--only", "torch (plain save paths),torch.distributed.checkpoint")
    assert re.search(r"^(\d+) files from 2 libraries -> ", gen, re.M), gen
    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert {e["kind"] for e in manifest["files"].values()} == {"file", "dcp"}
    results = tmp_path / "results.json"
    table = _run("corpus/measure.py", str(out), "--json", str(results))
    assert "| library | version | files | tensors | open exact | load tree |" in table
    rows = re.findall(r"^\| (torch \(plain save paths\)|torch\.distributed\.checkpoint|"
                      r"\*\*all 2\*\*) \|", table, re.M)
    assert len(rows) == 3, table
    assert "acceptance (open >= 99 %, load >= 95 %, 0 dangerous): met" in table
    data = json.loads(results.read_text())
    assert data["summary"]["files"] == len(manifest["files"]) == len(data["files"])
    assert set(data["files"][0]) >= {"file", "library", "open", "load", "scan", "weights_only"}


# ---- remote_batch.py --------------------------------------------------------------------


def test_remote_batch(torch: ModuleType) -> None:
    out = _run("remote_batch.py", "--quick")
    m = re.search(rf"^remote inspect of 1 MiB \(128 tensors\): (\d+) requests, ([\d,]+) bytes "
                  rf"= ({NUMBER}) % of the file, ({NUMBER}) s$", out, re.M)
    assert m, out
    assert int(m[1]) >= 1 and int(m[2].replace(",", "")) > 0 and float(m[3]) > 0
    m = re.search(rf"^convert: local ({NUMBER}) s, over HTTP ({NUMBER}) s \(({NUMBER})x local\), "
                  rf"(\d+) requests, ({NUMBER}) x the file read; outputs identical: (\w+)$",
                  out, re.M)
    assert m, out
    assert int(m[4]) >= 1 and float(m[5]) > 0
    assert m[6] == "True"
    batch = re.findall(rf"^batch convert, (\d+) worker\(s\): ({NUMBER}) files/s, (\d+) MB/s, "
                       rf"({NUMBER})x one worker \(({NUMBER}) s\)$", out, re.M)
    assert [int(b[0]) for b in batch] == sorted({1, 2, os.cpu_count() or 1}), out
    assert batch[0][3] == "1.00"  # one worker against itself
    assert all(float(b[1]) > 0 for b in batch)


# ---- scan_compare.py --------------------------------------------------------------------

SCANNERS = ("torchless", "picklescan", "modelscan", "fickling")


def test_scan_compare(shared_dir: Path) -> None:
    """Run with this interpreter's environment as VENV: picklescan, modelscan and fickling are
    test dependencies of nothing, so they are usually reported as not installed."""
    venv = sys.prefix
    out = _run("scan_compare.py", venv, "--quick")
    m = re.match(r"(\d+) files to flag, (\d+) not to flag \((.+)\)\n", out)
    assert m, out
    must, benign = int(m[1]), int(m[2])
    assert must > 0 and benign > 0
    sets = {name: count for name, _, count in (s.partition(": ") for s in m[3].split(", "))}
    # and the hostile set
    assert {"corpus", "fixtures", "labelled"} <= sets.keys() and len(sets) == 4
    assert sum(map(int, sets.values())) == must + benign

    lines = out.splitlines()
    head = lines.index("| scanner | misses (reported clean) | unscanned (error) | false alarms "
                       "| errors on benign | seconds |")
    assert lines[head + 1] == "| --- | ---: | ---: | ---: | ---: | ---: |"
    rows = {}
    for line in lines[head + 2:head + 2 + len(SCANNERS)]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    assert list(rows) == list(SCANNERS)
    for tool, cells in rows.items():
        if tool != "torchless" and cells == ["not installed"] * 5:
            assert f"{tool}: not installed in {venv}" in lines
            continue
        assert all(c.isdigit() for c in cells[:4]), cells
        assert int(cells[0]) + int(cells[1]) <= must and int(cells[2]) + int(cells[3]) <= benign
        assert re.fullmatch(r"\d+\.\d\d", cells[4]), cells
        assert f"{tool} misses: " in out and f"{tool} false alarms: " in out

    per_file = json.loads(_run("scan_compare.py", venv, "--quick", "--json"))
    assert list(per_file) == list(SCANNERS)
    assert isinstance(per_file["torchless"], dict)
    for tool, got in per_file.items():
        if tool != "torchless" and got == "not installed":
            assert rows[tool] == ["not installed"] * 5
            continue
        assert len(got) == must + benign
        for path, (outcome, seconds) in got.items():
            assert Path(path).is_absolute()
            assert outcome in ("flagged", "clean", "error")
            assert _positive(seconds)


def test_scan_compare_throughput(shared_dir: Path) -> None:
    out = _run("scan_compare.py", sys.prefix, "--throughput")
    lines = out.splitlines()
    assert re.match(r"\d+ real checkpoint files", lines[0]), out
    head = lines.index("| scanner | seconds | files/s | time vs torchless | CPU seconds | "
                       "CPU files/s | CPU vs torchless |")
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in lines[head + 2:head + 2 + len(SCANNERS)]]
    assert [r[0] for r in rows] == list(SCANNERS)
    assert float(rows[0][1]) > 0 and int(rows[0][2]) > 0 and rows[0][3] == "1.00x"
    assert float(rows[0][4]) > 0 and int(rows[0][5]) > 0 and rows[0][6] == "1.00x"
