"""Issue 26, row 15: the progress line (bytes or files done of the total, %, rate, time left,
drawn on a terminal only), ``-q/--quiet`` on every command and ``TORCHLESS_QUIET=1`` /
``TORCHLESS_PROGRESS=0``. Expected figures are hand arithmetic on a fake clock."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from torchless.cli.main import main
from torchless.cli.progress import Progress, eta, progress_wanted
from torchless.cli.show import human

from ..conftest import REPO

TINY = REPO / "examples" / "tiny.pt"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_line_says_percent_rate_and_time_left() -> None:
    clock = _Clock()
    out = _Tty()
    bar = Progress(human, stream=out, clock=clock)
    clock.now += 2.0  # 2 s: 256 MiB of 1 GiB = 25 %, 128 MiB/s, 768 MiB left = 6 s
    bar(256 << 20, 1 << 30)
    line = out.getvalue()
    assert line.startswith("\r[######..................]  25.0%")
    assert "256.0 MiB / 1.0 GiB" in line and "128.0 MiB/s" in line and "ETA 0:06" in line
    files = Progress(human, unit="files", stream=io.StringIO(), clock=clock)
    files.count = "40 tensors"
    assert files.line(3, 12, clock.now + 6.0).endswith(
        "3/12 files  0.5 files/s  ETA 0:18  40 tensors")


def test_nothing_is_drawn_for_a_fast_job_and_the_line_is_wiped() -> None:
    clock = _Clock()
    out = _Tty()
    bar = Progress(human, stream=out, clock=clock)
    clock.now += 0.2
    bar(10, 100)  # before 0.5 s: nothing
    assert out.getvalue() == ""
    clock.now += 0.4
    bar(50, 100)
    clock.now += 0.05
    bar(60, 100)  # within 0.1 s of the last draw: skipped
    assert out.getvalue().count("\r") == 1
    bar.close()
    assert out.getvalue().endswith("\r")  # wiped: the report's line starts clean
    width = len(out.getvalue().split("\r")[1])
    assert out.getvalue().split("\r")[2] == " " * width


def test_eta_format() -> None:
    assert (eta(0), eta(59.6), eta(61), eta(3725)) == ("0:00", "1:00", "1:01", "1:02:05")


def test_progress_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHLESS_PROGRESS", raising=False)
    assert progress_wanted(False, _Tty()) and not progress_wanted(False, io.StringIO())
    assert not progress_wanted(True, _Tty())  # -q
    monkeypatch.setenv("TORCHLESS_PROGRESS", "0")
    assert not progress_wanted(False, _Tty())


def _drawn(argv: list[str]) -> tuple[subprocess.CompletedProcess[bytes], str, bytes]:
    """``torchless ARGV`` run twice in a child with progress drawn at once: with stderr a
    pseudo-terminal (the run, what was drawn there) and piped (that run's stderr)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    code = ("import torchless.cli.progress as p; p._FIRST_DRAW = 0.0; "
            "from torchless.cli.main import main; "
            f"raise SystemExit(main({argv!r}))")
    leader, follower = pty.openpty()
    run = subprocess.run([sys.executable, "-c", code], stderr=follower,
                         stdout=subprocess.PIPE, env=env, timeout=120, check=False)
    os.close(follower)
    drawn = os.read(leader, 65536).decode()
    os.close(leader)
    piped = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env,
                           timeout=120, check=False)
    assert piped.returncode == run.returncode
    return run, drawn, piped.stderr


def test_convert_draws_on_a_terminal_only(tmp_path: Path) -> None:
    """stderr a pseudo-terminal: the line is drawn (a slow enough run) and wiped; piped:
    never a byte of it."""
    out = tmp_path / "o.safetensors"
    run, drawn, piped = _drawn(["convert", str(TINY), "-o", str(out), "--force"])
    assert run.returncode == 0 and "100.0%" in drawn and "ETA 0:00" in drawn
    assert "26/26 tensors" in drawn  # the entries safetensors finds in the output:
    safetensors = pytest.importorskip("safetensors")
    with safetensors.safe_open(tmp_path / "o.safetensors", "np") as f:
        assert len(f.keys()) == 26
    assert b"26 tensors" in run.stdout
    assert piped == b""


def test_quiet_on_every_command(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "t.safetensors"
    runs = [["convert", str(TINY), "-o", str(out)], ["inspect", str(TINY)],
            ["inspect", str(TINY), str(out)], ["scan", str(TINY)],
            ["verify", str(TINY), str(out)],
            ["inspect", str(TINY), "--html", "-o", str(tmp_path / "r.html"), "--force"]]
    for argv in runs:
        assert main([*argv, "-q"]) == 0, argv
        assert capsys.readouterr() == ("", ""), argv
    assert (tmp_path / "r.html").is_file()
    monkeypatch.setenv("TORCHLESS_QUIET", "1")
    for argv in runs[1:]:
        assert main(argv) == 0, argv
        assert capsys.readouterr() == ("", ""), argv
    assert main(["inspect", str(TINY), "--json"]) == 0  # JSON asked for is printed
    assert capsys.readouterr().out.startswith("{")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"nothing")
    assert main(["inspect", str(bad)]) == 1  # errors still go to stderr
    assert capsys.readouterr().err.startswith("torchless: error: ")


def test_quiet_and_json_do_not_go_together() -> None:
    for argv in (["inspect", str(TINY), "-q", "--json"], ["scan", str(TINY), "-q", "--json"],
                 ["convert", str(TINY), "-q", "--json"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 4


class _Recorder:
    """A progress callback that is also told the tensors written (``TensorProgress``)."""

    def __init__(self) -> None:
        self.bytes: list[tuple[int, int]] = []
        self.counts: list[tuple[int, int]] = []

    def __call__(self, done: int, total: int) -> None:
        self.bytes.append((done, total))

    def tensors(self, done: int, total: int) -> None:
        self.counts.append((done, total))


def test_convert_counts_tensors_across_shards(tmp_path: Path) -> None:
    """Tensors written of those written in all, rising to the number safetensors finds in
    every shard; bytes rising to the files' sizes (minus the index)."""
    torch = pytest.importorskip("torch")
    safetensors = pytest.importorskip("safetensors")
    import torchless

    sd = {f"t{i}": torch.full((50,), float(i)) for i in range(7)}
    torch.save(sd, tmp_path / "m.pt")
    rec = _Recorder()
    report = torchless.convert(tmp_path / "m.pt", tmp_path / "out", max_shard_size=450,
                               progress=rec, tree=False)
    shards = [Path(p) for p in report.files if p.endswith(".safetensors")]
    assert len(shards) > 2
    keys = 0
    for shard in shards:
        with safetensors.safe_open(shard, "np") as f:
            keys += len(f.keys())
    assert keys == 7
    assert rec.counts[-1] == (7, 7) and {t for _, t in rec.counts} == {7}
    assert [d for d, _ in rec.counts] == sorted(d for d, _ in rec.counts)
    assert rec.bytes[-1] == (sum(p.stat().st_size for p in shards),) * 2
    assert len(rec.counts) == len(rec.bytes)
    plain: list[tuple[int, int]] = []  # a plain function is told bytes only
    torchless.convert(tmp_path / "m.pt", tmp_path / "m.safetensors",
                      progress=lambda d, t: plain.append((d, t)))
    assert plain[-1][0] == plain[-1][1] == (tmp_path / "m.safetensors").stat().st_size


def test_scan_draws_files_on_a_terminal_only(tmp_path: Path) -> None:
    corpus = tmp_path / "models"
    corpus.mkdir()
    for name in ("a.pt", "b.pt", "c.pt"):
        (corpus / name).write_bytes(TINY.read_bytes())
    run, drawn, piped = _drawn(["scan", str(corpus)])
    assert run.returncode == 0 and "3/3 files" in drawn and "100.0%" in drawn
    assert drawn.endswith("\r")  # wiped before the table
    assert piped == b""
    assert main(["scan", str(corpus), "-q"]) == 0


def test_scan_paths_reports_each_file() -> None:
    from torchless.scanner.files import scan_paths

    seen: list[tuple[int, int]] = []
    report = scan_paths([str(TINY), str(TINY.parent)], progress=lambda d, t: seen.append(
        (d, t)))
    n = len(report.files)
    assert n > 1 and seen == [(k, n) for k in range(1, n + 1)]
