"""The command line: inspect output, JSON, exit codes and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torchless.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny.pt"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchless", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def test_inspect_example_text() -> None:
    out = run("inspect", str(EXAMPLE))
    assert out.returncode == 0, out.stderr
    assert "state_dict.0.weight" in out.stdout
    assert "bfloat16" in out.stdout
    assert "strided" in out.stdout  # the transposed mask
    assert "hparams.name: 'tiny-mlp'" in out.stdout


def test_inspect_json_matches_torch(torch: Any) -> None:
    out = run("inspect", str(EXAMPLE), "--json")
    assert out.returncode == 0, out.stderr
    (doc,) = json.loads(out.stdout)["files"]
    ref = torch.load(EXAMPLE, weights_only=False)
    expected = {f"state_dict.{k}": v for k, v in ref["state_dict"].items()}
    for name, t in expected.items():
        row = next(r for r in doc["tensors"] if r["name"] == name)
        assert row["shape"] == list(t.shape)
        assert row["dtype"] == str(t.dtype).removeprefix("torch.")
        assert row["nbytes"] == t.numel() * t.element_size()
    mask = next(r for r in doc["tensors"] if r["name"] == "mask")
    assert mask["contiguous"] is False
    assert mask["stride"] == list(ref["mask"].stride())
    assert doc["format"] == "zip"
    assert doc["tensor_count"] == len(doc["tensors"])


def test_error_is_one_line_and_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "model.pt"
    bad.write_bytes(b"<html><body>Not Found</body></html>")
    out = run("inspect", str(bad))
    assert out.returncode == 1
    assert out.stderr.count("\n") == 2  # the error, then what to do about it
    assert out.stderr.splitlines()[1].startswith("torchless: hint: ")
    assert "HTML" in out.stderr and "Traceback" not in out.stderr


def test_names_that_are_not_unicode_print_escaped(tmp_path: Path, torch: Any) -> None:
    """A tensor name with a lone surrogate (a hostile file's trick) is shown escaped, in
    text and JSON, instead of crashing the output."""
    path = tmp_path / "m.pt"
    torch.save({"bad\ud800": torch.ones(2), "ok": torch.zeros(1)}, path)
    out = run("inspect", str(path))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "bad\\ud800" in out.stdout and "ok" in out.stdout
    out = run("inspect", str(path), "--json")
    assert out.returncode == 0, out.stderr
    (doc,) = json.loads(out.stdout)["files"]
    assert "bad\ud800" in {r["name"] for r in doc["tensors"]}


def test_missing_file_is_exit_1(tmp_path: Path) -> None:
    out = run("inspect", str(tmp_path / "nope.pt"))
    assert out.returncode == 1
    assert "cannot open" in out.stderr


def test_usage_error_is_exit_4(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse's own errors (a missing argument, an unknown option) exit 4 too, not
    argparse's 2 (scan's "unreadable")."""
    for argv in (["inspect"], ["inspect", str(EXAMPLE), "--bogus"], ["scan"],
                 ["convert", str(EXAMPLE), "--max-shard-size"], ["frobnicate"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 4, argv
        assert "error:" in capsys.readouterr().err


def test_convert_src_dst_is_refused_before_writing(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``convert A B`` with B missing (the output written as cp takes it) would convert A
    to its default output beside A and then fail on B: it is a usage error, nothing
    written, and the message shows the -o form."""
    src = tmp_path / "model.pt"
    src.write_bytes(EXAMPLE.read_bytes())
    dst = tmp_path / "out.safetensors"
    with pytest.raises(SystemExit) as info:
        main(["convert", str(src), str(dst)])
    assert info.value.code == 4
    err = capsys.readouterr().err
    assert f"-o {dst}" in err and "does not exist" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]
    # two sources that exist are still a batch, each to its default output
    other = tmp_path / "other.pt"
    other.write_bytes(EXAMPLE.read_bytes())
    assert main(["convert", str(src), str(other)]) == 0
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "other.safetensors").exists()


def test_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    assert "examples:" in capsys.readouterr().out


class Config:
    def __init__(self) -> None:
        self.lr = 0.1


def test_strict_refuses_unknown_classes_and_default_keeps_them(tmp_path: Path) -> None:
    import pickle

    path = tmp_path / "cfg.pkl"
    path.write_bytes(pickle.dumps({"cfg": Config()}, protocol=2))
    assert run("inspect", str(path)).returncode == 0
    out = run("inspect", str(path), "--strict")
    assert out.returncode == 1
    assert "refused global" in out.stderr and "Config" in out.stderr


class _CallsGetenv:
    """Pickles as a call of os.getenv: torch.load would run it (harmless here, but a name
    the policy refuses)."""

    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return (os.getenv, ("TORCHLESS_NOT_SET",))


def test_allow_global_lets_a_trusted_file_convert_and_verify(torch: Any,
                                                             tmp_path: Path) -> None:
    import torchless

    src, out = tmp_path / "trusted.pt", tmp_path / "trusted.safetensors"
    w = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    torch.save({"w": w, "extra": _CallsGetenv()}, src)
    refused = run("convert", str(src))
    assert refused.returncode == 1 and not out.exists()
    error, hint = refused.stderr.splitlines()
    assert "os.getenv" in error and "--allow-global os.getenv" in hint
    done = run("convert", str(src), "--allow-global", "os.getenv", "--verify")
    assert done.returncode == 0, done.stderr
    assert run("verify", str(src), str(out)).returncode == 1  # verify re-reads SRC: refused
    assert run("verify", str(src), str(out), "--allow-global", "os.getenv").returncode == 0
    back = torchless.load(out)
    assert back["w"].tobytes() == w.numpy().tobytes()
    assert isinstance(back["extra"], torchless.Opaque)  # kept as data, never called
    assert (back["extra"].callable.module, back["extra"].callable.name) == ("os", "getenv")
    assert back["extra"].args == ("TORCHLESS_NOT_SET",)


@pytest.mark.parametrize("command", ["convert", "inspect"])
def test_directory_without_checkpoints_is_an_error(command: str, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("no checkpoint here")
    (tmp_path / ".hidden.pt").write_bytes(EXAMPLE.read_bytes())
    out = run(command, str(tmp_path))
    assert out.returncode == 3 and out.stdout == ""  # nothing to do
    error, hint = out.stderr.splitlines()
    assert error.startswith("torchless: error: no checkpoint files in ")
    assert str(tmp_path) in error and "*.pt" in error
    assert hint.startswith("torchless: hint: ")
    assert not list(tmp_path.glob("*.safetensors"))


def test_names_from_a_file_cannot_drive_the_terminal(torch: Any, tmp_path: Path) -> None:
    """A tensor name with a newline, a terminal escape (clear screen), a carriage return and
    a right-to-left override is printed escaped by every text output: it adds no line and
    no control character reaches the terminal."""
    hostile = "evil\x1b[2J\rname\nforged line\u202eabc"
    src = tmp_path / "names.pt"
    torch.save({hostile: torch.ones(2), "plain": torch.zeros(3)}, src)
    outputs = {
        "inspect": run("inspect", str(src)),
        "convert": run("convert", str(src), "--verify"),
        "verify": run("verify", str(src), str(tmp_path / "names.safetensors")),
        "scan": run("scan", "-v", str(src)),
        "many": run("inspect", str(src), str(src)),
    }
    escaped = "evil\\x1b[2J\\x0dname\\x0aforged line\\u202eabc"
    for what, out in outputs.items():
        assert out.returncode == 0, (what, out.stderr)
        text = out.stdout + out.stderr
        assert not any(c in text for c in "\x1b\r\u202e"), what
        assert not any(line.startswith("forged line") for line in text.splitlines()), what
    assert escaped in outputs["inspect"].stdout and escaped in outputs["verify"].stdout
    # JSON keeps the name exactly
    (doc,) = json.loads(run("inspect", str(src), "--json").stdout)["files"]
    assert hostile in {t["name"] for t in doc["tensors"]}


def test_report_with_one_source_is_a_usage_error(tmp_path: Path) -> None:
    """Was: accepted and silently ignored (no report file written)."""
    out = run("convert", str(EXAMPLE), "-o", str(tmp_path / "x.safetensors"),
              "--report", str(tmp_path / "r.jsonl"))
    assert out.returncode == 4 and "--report" in out.stderr
    assert not (tmp_path / "r.jsonl").exists() and not (tmp_path / "x.safetensors").exists()
