"""``inspect --html`` in a real headless Chromium: the page renders (a screenshot with the
verdict badge and the treemap's colours in it), the tensor table sorts when a header is
clicked (the page clicks it itself for ``?sort=COLUMN``), and names from the file stay text.

Chromium comes from the system (Debian's ``chromium``); without it these tests skip, unless
TORCHLESS_REQUIRE_BROWSER=1 (CI sets it and installs chromium), where they fail."""

from __future__ import annotations

import html.parser
import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from torchless.cli.html import squarify
from torchless.cli.main import main

from ..conftest import REPO

TINY = REPO / "examples" / "tiny.pt"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]


@pytest.fixture(scope="module")
def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("TORCHLESS_REQUIRE_BROWSER"):
        pytest.fail("TORCHLESS_REQUIRE_BROWSER is set but no chromium is installed "
                    "(apt-get install -y chromium)")
    pytest.skip("no chromium (apt-get install -y chromium; CI sets TORCHLESS_REQUIRE_BROWSER)")


def _run(chromium: str, tmp: Path, *args: str) -> str:
    out = subprocess.run([chromium, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *args],
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stdout


class _Rows(html.parser.HTMLParser):
    """The tensor table's cells (data-value) by row, and each header's aria-sort."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.sorted: dict[str, str] = {}
        self.in_body = False
        self.scripts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tbody" and self.in_table:
            self.in_body = True
        if tag == "table":
            self.in_table = a.get("id") == "tensors"
        if tag == "th" and a.get("aria-sort"):
            self.sorted[str(a.get("data-key"))] = str(a["aria-sort"])
        if tag == "tr" and self.in_body:
            self.rows.append([])
        if tag == "td" and self.in_body:
            self.rows[-1].append(str(a.get("data-value")))

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody":
            self.in_body = False

    in_table = False


def _rows(dom: str) -> _Rows:
    p = _Rows()
    p.feed(dom)
    return p


def _report(tmp_path: Path, src: Path = TINY) -> Path:
    out = tmp_path / "report.html"
    assert main(["inspect", str(src), "--html", "-o", str(out)]) == 0
    return out


def test_table_sorts_in_the_browser(chromium: str, tmp_path: Path) -> None:
    page = _report(tmp_path)
    plain = _rows(_run(chromium, tmp_path, "--dump-dom", page.as_uri()))
    assert not plain.sorted and len(plain.rows) == 26  # no script run: file order
    names = [r[0] for r in plain.rows]
    assert names != sorted(names)  # so that sorting by name is visible
    by_name = _rows(_run(chromium, tmp_path, "--dump-dom", page.as_uri() + "?sort=name"))
    assert [r[0] for r in by_name.rows] == sorted(names)
    assert by_name.sorted == {"name": "ascending"}
    by_bytes = _rows(_run(chromium, tmp_path, "--dump-dom",
                          page.as_uri() + "?sort=bytes&desc=1"))
    sizes = [int(r[4]) for r in by_bytes.rows]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == 512
    assert by_bytes.sorted == {"bytes": "descending"}


def _png_pixels(data: bytes) -> tuple[int, int, np.ndarray]:
    """Width, height and RGB(A) rows of an 8-bit non-interlaced PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and body[12] == 0
            channels = {2: 3, 6: 4}[color]
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = width * channels
    out = np.zeros((height, stride), dtype=np.int32)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int32)
        cur = np.zeros(stride, dtype=np.int32)
        for x in range(stride):
            a = cur[x - channels] if x >= channels else 0
            b = prev[x]
            c = prev[x - channels] if x >= channels else 0
            if f == 0:
                pred = 0
            elif f == 1:
                pred = a
            elif f == 2:
                pred = b
            elif f == 3:
                pred = (a + b) // 2
            else:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
            cur[x] = (line[x] + pred) & 0xFF
        out[y], prev = cur, cur
    return width, height, out.reshape(height, width, channels)


def test_page_renders(chromium: str, tmp_path: Path) -> None:
    page = _report(tmp_path)
    shot = tmp_path / "shot.png"
    _run(chromium, tmp_path, "--window-size=800,600", f"--screenshot={shot}", page.as_uri())
    width, height, px = _png_pixels(shot.read_bytes())
    assert (width, height) == (800, 600)
    colours = {tuple(int(c) for c in p[:3]) for p in px.reshape(-1, px.shape[2])[::7]}
    assert len(colours) > 20  # text, table and treemap, not a blank or error page
    badge = np.all(np.abs(px[:, :, :3] - np.array([218, 251, 225])) <= 2, axis=2)
    assert badge.sum() > 100  # the "clean" verdict badge is drawn


def test_names_from_the_file_stay_text(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    evil = '<img src=x onerror="alert(1)">.w'
    save_file({evil: np.zeros(3, np.float32), "ok": np.ones(2, np.float32)},
              str(tmp_path / "m.safetensors"))
    text = _report(tmp_path, tmp_path / "m.safetensors").read_text()
    assert "<img" not in text and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in text
    assert "http://" not in text and "https://" not in text  # self-contained


def test_a_name_with_a_lone_surrogate(tmp_path: Path) -> None:
    """A pickle's BINUNICODE may hold a lone surrogate (UTF-8 cannot): the page escapes it
    (the write raised UnicodeEncodeError, an internal error)."""
    from tests._fuzz_inputs import tensor_ops, zip_checkpoint

    name = "\ud800w".encode("utf-8", "surrogatepass")
    data = (b"\x80\x02ccollections\nOrderedDict\n)R" + b"X" + struct.pack("<I", len(name))
            + name + tensor_ops("0", 2, 0, (2,), (1,)) + b"s.")
    src = tmp_path / "s.pt"
    src.write_bytes(zip_checkpoint(data, {"0": bytes(8)}))
    text = _report(tmp_path, src).read_text(encoding="utf-8")
    assert "\\ud800w" in text


def test_squarify_tiles_the_rectangle() -> None:
    sizes = [6.0, 6.0, 4.0, 3.0, 2.0, 2.0, 1.0]  # the example of Bruls et al., area 24
    rects = squarify(sizes, (0.0, 0.0, 6.0, 4.0))
    for (x, y, w, h), s in zip(rects, sizes, strict=True):
        assert w * h == pytest.approx(s)
        assert x >= -1e-9 and y >= -1e-9 and x + w <= 6 + 1e-9 and y + h <= 4 + 1e-9
    for i, a in enumerate(rects):
        for b in rects[i + 1:]:
            overlap_w = min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0])
            overlap_h = min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1])
            assert overlap_w <= 1e-9 or overlap_h <= 1e-9
    assert rects[0] == pytest.approx((0.0, 0.0, 3.0, 2.0))  # the paper's first row: 2 x 3


def _dangerous(tmp_path: Path) -> Path:
    """A torch ZIP checkpoint whose pickle calls os.system beside a tensor (written by hand:
    the payload is never run)."""
    from tests._fuzz_inputs import tensor_ops, zip_checkpoint

    data = (b"\x80\x02ccollections\nOrderedDict\n)R(" + b"X\x01\x00\x00\x00w"
            + tensor_ops("0", 2, 0, (2,), (1,)) + b"X\x01\x00\x00\x00x"
            + b"cos\nsystem\nX\x04\x00\x00\x00true\x85R" + b"u.")
    src = tmp_path / "evil.pt"
    src.write_bytes(zip_checkpoint(data, {"0": bytes(8)}))
    return src


def test_a_dangerous_file_gets_its_report(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Was: no page at all (the file is refused); the page never listed the findings. Now:
    the red verdict, the actions grouped by package, the globals, the tensors and the
    inert records, and exit 1 (the file is refused)."""
    src = _dangerous(tmp_path)
    out = tmp_path / "report.html"
    assert main(["inspect", str(src), "--html", "-o", str(out)]) == 1
    printed = capsys.readouterr()
    assert "scan verdict dangerous" in printed.out and "refused global" in printed.err
    text = out.read_text()
    assert 'id="verdict">dangerous<' in text
    assert "calls 1 callable of os 1 time: system" in text  # scanner.report.action_groups
    assert "imports 1 name of os: system" in text
    assert "<code>collections.OrderedDict</code></td><td>rebuilt" in text  # the globals
    assert "<code>os.system</code></td><td>dangerous" in text
    assert 'id=refused' in text and "kept as inert records" in text
    assert _rows(text).rows[0][:3] == ["w", "float32", "2"]  # the tensor table
    assert "<h2>Kept as inert records</h2><ul id=opaque><li><code>os.system</code>" in text


def test_a_dangerous_report_renders_red(chromium: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.html"
    assert main(["inspect", str(_dangerous(tmp_path)), "--html", "-o", str(out)]) == 1
    capsys.readouterr()
    shot = tmp_path / "shot.png"
    _run(chromium, tmp_path, "--window-size=800,600", f"--screenshot={shot}", out.as_uri())
    _, _, px = _png_pixels(shot.read_bytes())
    red = np.all(np.abs(px[:, :, :3] - np.array([255, 235, 233])) <= 2, axis=2)
    green = np.all(np.abs(px[:, :, :3] - np.array([218, 251, 225])) <= 2, axis=2)
    assert red.sum() > 100 and green.sum() == 0  # the red badges, no clean one
    dom = _run(chromium, tmp_path, "--dump-dom", out.as_uri())
    assert "calls 1 callable of os 1 time: system" in dom
    assert len(_rows(dom).rows) == 1  # the tensor table is there, with the tensor


def test_the_report_of_a_clean_index_and_its_shards(chromium: str, tmp_path: Path) -> None:
    """An index's page: the model's tensors, and the scan of the index and each shard, all
    clean: no red pill."""
    from safetensors.numpy import save_file

    save_file({"a": np.zeros(2, np.float32)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b": np.ones(3, np.float32)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text('{"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", '
                     '"b": "model-00002-of-00002.safetensors"}}')
    page = _report(tmp_path, index)
    shot = tmp_path / "shot.png"
    _run(chromium, tmp_path, "--window-size=800,600", f"--screenshot={shot}", page.as_uri())
    _, _, px = _png_pixels(shot.read_bytes())
    red = np.all(np.abs(px[:, :, :3] - np.array([255, 235, 233])) <= 2, axis=2)
    green = np.all(np.abs(px[:, :, :3] - np.array([218, 251, 225])) <= 2, axis=2)
    assert red.sum() == 0 and green.sum() > 100
    assert len(_rows(_run(chromium, tmp_path, "--dump-dom", page.as_uri())).rows) == 2
