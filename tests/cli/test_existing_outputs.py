"""Issue 26, row 16: one existing-output rule (torchless.conversion.existing) for every
writer: convert of one file, of several, of a model directory, ``inspect --html -o`` and the
API's convert and batch. An existing output is refused unless --force / force=True, or kept
with --skip-existing / skip_existing=True when it verifies; an output that is a source (the
same path, a hard link, a symlink) is refused whatever is asked, by name."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import pytest

import torchless
from torchless.cli.main import main

from ..conftest import REPO

TINY = REPO / "examples" / "tiny.pt"


def _src(tmp_path: Path, name: str = "a.pt") -> Path:
    src = tmp_path / name
    src.write_bytes(TINY.read_bytes())
    return src


def _mtime(path: Path) -> int:
    return os.stat(path).st_mtime_ns


def test_one_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _src(tmp_path)
    dst = tmp_path / "a.safetensors"
    assert main(["convert", str(src), "-q"]) == 0
    capsys.readouterr()
    before, mtime = dst.read_bytes(), _mtime(dst)
    assert main(["convert", str(src)]) == 1
    err = capsys.readouterr().err
    assert "the output file exists" in err and str(dst) in err
    # kept: it verifies, nothing is written
    assert main(["convert", str(src), "--skip-existing"]) == 0
    assert "already converted (verified" in capsys.readouterr().out
    assert _mtime(dst) == mtime
    assert main(["convert", str(src), "--force", "-q"]) == 0
    assert _mtime(dst) != mtime and dst.read_bytes() == before
    # an output that does not verify is refused by --skip-existing, replaced with --force
    dst.write_bytes(b"not this")
    assert main(["convert", str(src), "--skip-existing"]) == 1
    assert "does not match" in capsys.readouterr().err and dst.read_bytes() == b"not this"
    assert main(["convert", str(src), "--skip-existing", "--force", "-q"]) == 0
    assert dst.read_bytes() == before


def test_api_convert_follows_the_same_rule(tmp_path: Path) -> None:
    src = _src(tmp_path)
    first = torchless.convert(src)
    assert not first.existing and first.files == (first.dst,)
    with pytest.raises(torchless.ConversionError, match="exists"):
        torchless.convert(src)
    kept = torchless.convert(src, skip_existing=True)
    assert kept.existing and kept.files == () and kept.verified is not None
    assert kept.tensors == first.tensors == len(kept.verified.matched)
    assert not torchless.convert(src, force=True).existing


@pytest.mark.parametrize("how", ["hardlink", "symlink", "same path"])
def test_the_source_is_never_its_own_output(tmp_path: Path, how: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Even with --force (and --skip-existing: no file is verified against itself)."""
    real = tmp_path / "w.safetensors"
    assert main(["convert", str(TINY), "-o", str(real), "-q"]) == 0
    before = real.read_bytes()
    other = tmp_path / "same.safetensors"
    if how == "hardlink":
        os.link(real, other)
    elif how == "symlink":
        other.symlink_to(real)
    else:
        other = real
    for force in ({"force": True}, {"skip_existing": True}, {}):
        with pytest.raises(torchless.ConversionError, match="the source file") as info:
            torchless.convert(real, other, **force)
        assert str(other) in str(info.value)
    refused = torchless.batch([real], "convert", skip_existing=True, force=True)
    assert refused[0].status == "refused" and "source file itself" in (refused[0].error or "")
    assert real.read_bytes() == before
    with pytest.raises(SystemExit) as usage:  # the CLI says it before reading anything
        main(["convert", str(real), "-o", str(other), "--force", "--skip-existing"])
    assert usage.value.code == 4 and "its own output" in capsys.readouterr().err
    assert real.read_bytes() == before


def test_several_sources(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _src(tmp_path, "a.pt"), _src(tmp_path, "b.pt")
    assert main(["convert", str(a), str(b), "-q"]) == 0
    mtimes = [_mtime(tmp_path / n) for n in ("a.safetensors", "b.safetensors")]
    assert main(["convert", str(a), str(b)]) == 1
    out = capsys.readouterr()
    assert out.err.count("the output file exists") == 2 and "2 failed" in out.out
    assert "--skip-existing" in out.err  # the hint says how to resume
    assert main(["convert", str(a), str(b), "--skip-existing"]) == 0
    assert "0 converted, 2 already done, 0 failed" in capsys.readouterr().out
    assert [_mtime(tmp_path / n) for n in ("a.safetensors", "b.safetensors")] == mtimes


def test_model_directory(torch: ModuleType, tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m"
    model.mkdir()
    torch.save({"w": torch.arange(6.0)}, model / "pytorch_model.bin")
    (model / "config.json").write_text("{}")
    out = tmp_path / "out"
    assert main(["convert", str(model), "-o", str(out), "-q"]) == 0
    mtime = _mtime(out / "model.safetensors")
    assert main(["convert", str(model), "-o", str(out)]) == 1
    assert "exist" in capsys.readouterr().err and _mtime(out / "model.safetensors") == mtime
    assert main(["convert", str(model), "-o", str(out), "--skip-existing"]) == 1
    assert "converted whole" in capsys.readouterr().err
    assert main(["convert", str(model), "-o", str(out), "--force", "-q"]) == 0
    assert _mtime(out / "model.safetensors") != mtime
    # in place, twice: the second refused, config.json (its own source) no output
    assert main(["convert", str(model), "-q"]) == 0
    assert main(["convert", str(model)]) == 1
    assert "model.safetensors" in capsys.readouterr().err


def test_inspect_html_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _src(tmp_path)
    page = tmp_path / "r.html"
    page.write_text("mine")
    assert main(["inspect", str(src), "--html", "-o", str(page)]) == 1
    assert "exists" in capsys.readouterr().err and page.read_text() == "mine"
    assert main(["inspect", str(src), "--html", "-o", str(page), "--force", "-q"]) == 0
    assert page.read_text().startswith("<!")
    before = src.read_bytes()
    assert main(["inspect", str(src), "--html", "-o", str(src), "--force"]) == 1
    assert "the source file itself" in capsys.readouterr().err and src.read_bytes() == before
