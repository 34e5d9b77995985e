"""torchless.batch: many files through any concurrent.futures.Executor, resumable.

Oracles: torch.load of each source (through torchless.verify, itself checked against torch
elsewhere), the serial run for the parallel ones, and the files on disk.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest

import torchless
from torchless.api.batch import batch, expand

pytestmark = pytest.mark.torch

#: A pickle that would run os.system("true") if unpickled: GLOBAL posix system, REDUCE.
EVIL = b"\x80\x02cposix\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03."


def _mixed_dir(torch: ModuleType, root: Path, n: int = 4, numel: int = 64) -> Path:
    (root / "sub").mkdir(parents=True)
    for i in range(n):
        torch.save({"w": torch.arange(numel, dtype=torch.float32) * i, "epoch": i},
                   root / f"m{i}.pt")
    torch.save({"x": torch.ones(3, dtype=torch.bfloat16)}, root / "sub" / "n.pth",
               _use_new_zipfile_serialization=False)
    (root / "garbage.bin").write_bytes(b"not a checkpoint at all")
    (root / "evil.pkl").write_bytes(EVIL)
    (root / "notes.txt").write_text("ignored: not a checkpoint name")
    return root


def _statuses(results: list[torchless.BatchResult], root: Path) -> dict[str, str]:
    return {os.path.relpath(r.path, root): r.status for r in results}


EXPECTED = {"evil.pkl": "refused", "garbage.bin": "refused", "m0.pt": "done", "m1.pt": "done",
            "m2.pt": "done", "m3.pt": "done", "sub/n.pth": "done"}


def test_expand_walks_directories_sorted(tmp_path: Path) -> None:
    (tmp_path / "d" / "b").mkdir(parents=True)
    for name in ("d/z.pt", "d/a.ckpt", "d/b/c.bin", "d/x.txt", "d/.hidden.pt", "e.weird"):
        (tmp_path / name).write_bytes(b"")
    got = [os.path.relpath(p, tmp_path) for p in expand([tmp_path / "d", tmp_path / "e.weird"])]
    assert got == ["d/a.ckpt", "d/z.pt", "d/b/c.bin", "e.weird"]


def test_serial_then_resume(torch: ModuleType, tmp_path: Path) -> None:
    root = _mixed_dir(torch, tmp_path / "d")
    report = tmp_path / "run.jsonl"
    first = batch([root], "convert", report=report)
    assert _statuses(first, root) == EXPECTED
    evil = next(r for r in first if r.path.endswith("evil.pkl"))
    assert evil.error is not None and "posix.system" in evil.error
    for r in first:
        if r.status == "done":
            assert r.output is not None and torchless.verify(r.path, r.output).ok
    lines = [json.loads(x) for x in report.read_text().splitlines()]
    assert [(x["path"], x["status"], x["ok"]) for x in lines] == [
        (r.path, r.status, r.ok) for r in first]
    mtimes = {r.output: os.stat(r.output).st_mtime_ns for r in first if r.output}
    # the one existing-output rule: an existing output is refused unless asked otherwise
    refused = {os.path.relpath(r.path, root): r for r in batch([root], "convert")}
    for name, status in EXPECTED.items():
        assert refused[name].status == "refused"
        assert ("the output file exists" in (refused[name].error or "")) == (
            status == "done")
    again = batch([root], "convert", report=report, skip_existing=True)
    assert {k: v for k, v in _statuses(again, root).items()} == {
        k: ("skipped" if v == "done" else v) for k, v in EXPECTED.items()}
    assert {o: os.stat(o).st_mtime_ns for o in mtimes} == mtimes  # nothing rewritten
    assert len(report.read_text().splitlines()) == 2 * len(EXPECTED)
    with pytest.warns(DeprecationWarning, match="skip_existing"):
        old = batch([root], "convert", resume=True)  # the old name, the same result
    assert _statuses(old, root) == _statuses(again, root)


def test_scan_and_inspect_ops(torch: ModuleType, tmp_path: Path) -> None:
    root = _mixed_dir(torch, tmp_path / "d")
    inspected = {os.path.relpath(r.path, root): r for r in batch([root], "inspect")}
    assert inspected["m2.pt"].detail["tensors"] == 1
    assert inspected["m2.pt"].detail["bytes"] == 64 * 4
    assert inspected["evil.pkl"].status == "refused"
    scanned = {os.path.relpath(r.path, root): r for r in batch([root], "scan")}
    assert all(r.status == "done" for r in scanned.values())
    assert scanned["evil.pkl"].detail["files"][0]["status"] == "dangerous"
    assert scanned["evil.pkl"].detail["exit_code"] == 1
    assert {scanned[n].detail["files"][0]["status"] for n in ("m0.pt", "sub/n.pth")} == {
        "clean"}


def test_process_pool_matches_serial(torch: ModuleType, tmp_path: Path) -> None:
    serial_root = _mixed_dir(torch, tmp_path / "a")
    pool_root = _mixed_dir(torch, tmp_path / "b")
    serial = batch([serial_root], "convert")
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("forkserver")) as pool:
        parallel = batch([pool_root], "convert", pool)
    assert _statuses(parallel, pool_root) == _statuses(serial, serial_root)
    for a, b in zip(serial, parallel, strict=True):
        if a.output and b.output:
            assert Path(a.output).read_bytes() == Path(b.output).read_bytes()


@pytest.mark.filterwarnings("ignore")
def test_dask_local_cluster_matches_serial(torch: ModuleType, tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    serial_root = _mixed_dir(torch, tmp_path / "a")
    dask_root = _mixed_dir(torch, tmp_path / "b")
    serial = batch([serial_root], "convert")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        assert len(client.scheduler_info()["workers"]) == 2
        on_dask = batch([dask_root], "convert", client.get_executor(pure=False))
    assert _statuses(on_dask, dask_root) == _statuses(serial, serial_root)
    for a, b in zip(serial, on_dask, strict=True):
        if a.output and b.output:
            assert Path(a.output).read_bytes() == Path(b.output).read_bytes()


_KILLED_CHILD = textwrap.dedent("""
    import sys, time
    from concurrent.futures import ProcessPoolExecutor
    from torchless.api.batch import batch
    with ProcessPoolExecutor(2) as pool:
        batch([sys.argv[1]], "convert", pool, report=sys.argv[2])
""")


def test_killed_run_resumes_without_redoing(torch: ModuleType, tmp_path: Path) -> None:
    """SIGKILL to a run (and its workers) once some files are done: the re-run skips what
    was finished (verified, not rewritten) and converts the rest."""
    root = tmp_path / "d"
    root.mkdir()
    for i in range(12):
        torch.save({"w": torch.full((2 * 1024 * 1024,), float(i))}, root / f"m{i:02d}.pt")
    report = tmp_path / "run.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_CHILD, str(root), str(report)],
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if report.exists() and len(report.read_text().splitlines()) >= 2:
            break
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_first = {json.loads(x)["path"] for x in report.read_text().splitlines()
                  if json.loads(x)["status"] == "done"}
    assert done_first, "the first run finished nothing before it was killed"
    mtimes = {p: os.stat(p[:-3] + ".safetensors").st_mtime_ns for p in done_first}
    results = batch([root], "convert", skip_existing=True)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    skipped = {r.path for r in results if r.status == "skipped"}
    assert done_first <= skipped
    assert {p: os.stat(p[:-3] + ".safetensors").st_mtime_ns for p in done_first} == mtimes
    for r in results:
        assert r.output is not None and torchless.verify(r.path, r.output).ok
    visible = [n for n in os.listdir(root) if not n.startswith(".")]
    assert sorted(visible) == sorted([f"m{i:02d}.pt" for i in range(12)]
                                     + [f"m{i:02d}.safetensors" for i in range(12)])


def test_cli_inspect_and_scan_many(torch: ModuleType, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from torchless.cli.main import main

    root = _mixed_dir(torch, tmp_path / "d")
    for jobs in ("1", "2"):
        assert main(["inspect", str(root), "--jsonl", "-j", jobs]) == 1  # two refused
        docs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        by_name = {os.path.relpath(d["path"], root): d for d in docs}
        assert set(by_name) == set(EXPECTED)
        assert by_name["m3.pt"]["tensor_count"] == 1 and by_name["m3.pt"]["ok"]
        assert by_name["sub/n.pth"]["format"] == "legacy"
        assert by_name["evil.pkl"]["status"] == "refused"
        assert main(["inspect", str(root), "--json", "-j", jobs]) == 1  # the same entries
        assert json.loads(capsys.readouterr().out)["files"] == docs
        assert main(["scan", str(root), "--json", "-j", jobs]) == 1  # evil.pkl
        report = json.loads(capsys.readouterr().out)
        status = {os.path.relpath(f["path"], root): f["status"] for f in report["files"]}
        assert status["evil.pkl"] == "dangerous" and status["m0.pt"] == "clean"
        assert status["notes.txt"] == "skipped"


@pytest.mark.filterwarnings("ignore")
def test_dask_worker_killed_mid_run_then_resume(torch: ModuleType, tmp_path: Path) -> None:
    """One of two Dask workers is SIGKILLed once some files are done: the run still ends
    with a result per file (the cluster reruns the lost tasks, or the file is reported
    failed), and a re-run converts what is missing without redoing finished files."""
    distributed = pytest.importorskip("distributed")
    import threading

    root = tmp_path / "d"
    root.mkdir()
    for i in range(10):
        torch.save({"w": torch.full((1024 * 1024,), float(i))}, root / f"m{i:02d}.pt")
    report = tmp_path / "run.jsonl"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        pids = client.run(os.getpid)
        assert len(pids) == 2
        out: list[list[torchless.BatchResult]] = []
        runner = threading.Thread(target=lambda: out.append(
            batch([root], "convert", client.get_executor(pure=False), report=report)))
        runner.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
                report.exists() and report.read_text().count("\n") >= 2):
            time.sleep(0.01)
        os.kill(next(iter(pids.values())), signal.SIGKILL)
        runner.join(timeout=300)
        assert not runner.is_alive() and out
    first = out[0]
    assert len(first) == 10
    done_first = {r.path for r in first if r.status == "done"}
    assert len(done_first) >= 2
    mtimes = {p: os.stat(p[:-3] + ".safetensors").st_mtime_ns for p in done_first}
    again = batch([root], "convert", skip_existing=True)
    assert all(r.ok for r in again), [r.error for r in again if not r.ok]
    assert {r.path for r in again if r.status == "skipped"} >= done_first
    assert {p: os.stat(p[:-3] + ".safetensors").st_mtime_ns for p in done_first} == mtimes
    for r in again:
        assert r.output is not None and torchless.verify(r.path, r.output).ok
