"""``inspect --html``: one self-contained page (no script, style or font fetched from
anywhere) with the scan verdict and its findings (per file scanned: the actions torch.load
would take grouped by package, the globals named, the anomalies), the known structures, the
totals by dtype, a treemap of tensor bytes by module prefix, the tensor table (sortable by
any column) and the records (sparse, quantized … tensors; inert objects). A file torchless
refuses (a dangerous one) gets the page too: read with the names it was refused for kept
as inert records, for the page only.

Every name from the file is HTML-escaped and reaches the page only as element text or an
attribute value; the page's one script reads nothing but the table's cells (and, for tests
and links, ``?sort=COLUMN&desc=1``)."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["page", "squarify"]

Rect = tuple[float, float, float, float]  # x, y, width, height

_STYLE = """
body{font:14px system-ui,sans-serif;margin:24px;color:#1b1f24;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}
.muted{color:#57606a}.verdict{display:inline-block;padding:2px 10px;border-radius:10px;
font-weight:600}.clean{background:#dafbe1;color:#116329}.dangerous,.anomalous,.unreadable,
.error{background:#ffebe9;color:#a40e26}.unvetted{background:#fff8c5;color:#7d4e00}
.error-text{color:#a40e26}h3{font-size:14px;margin:16px 0 6px}table{border-collapse:collapse}
th,td{padding:3px 10px;border-bottom:1px solid #d0d7de;text-align:left;white-space:nowrap}
th{cursor:pointer;user-select:none;background:#f6f8fa;position:sticky;top:0}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
td.num,th.num{text-align:right}svg text{font-size:11px;pointer-events:none}
"""

_SCRIPT = """
(function(){
  var table=document.getElementById('tensors');if(!table)return;
  var body=table.tBodies[0],heads=table.tHead.rows[0].cells;
  function sort(i,desc){
    var rows=Array.prototype.slice.call(body.rows),num=heads[i].dataset.type==='num';
    rows.sort(function(a,b){
      var x=a.cells[i].dataset.value,y=b.cells[i].dataset.value,c;
      if(num){c=parseFloat(x)-parseFloat(y);}else{c=x<y?-1:x>y?1:0;}
      return desc?-c:c;});
    rows.forEach(function(r){body.appendChild(r);});
    for(var j=0;j<heads.length;j++)heads[j].removeAttribute('aria-sort');
    heads[i].setAttribute('aria-sort',desc?'descending':'ascending');
  }
  Array.prototype.forEach.call(heads,function(h,i){
    h.addEventListener('click',function(){
      sort(i,h.getAttribute('aria-sort')==='ascending');});});
  var q=new URLSearchParams(location.search),key=q.get('sort');
  if(key){Array.prototype.forEach.call(heads,function(h){
    if(h.dataset.key===key){h.click();if(q.get('desc'))h.click();}});}
})();
"""


def squarify(sizes: Sequence[float], rect: Rect) -> list[Rect]:
    """Squarified treemap (Bruls, Huizing, van Wijk 2000): a rectangle per size (sorted
    descending), in order, tiling ``rect`` with areas proportional to the sizes."""
    total = sum(sizes)
    x, y, w, h = rect
    if not sizes or total <= 0 or w <= 0 or h <= 0:
        return [(x, y, 0.0, 0.0) for _ in sizes]
    scale = w * h / total
    areas = [s * scale for s in sizes]
    out: list[Rect] = []
    i = 0
    while i < len(areas):
        side = min(w, h)
        row = [areas[i]]
        j = i + 1
        while j < len(areas) and _worst([*row, areas[j]], side) <= _worst(row, side):
            row.append(areas[j])
            j += 1
        thick = sum(row) / side
        pos = 0.0
        for a in row:  # the row runs along the shorter side
            length = a / thick
            out.append((x, y + pos, thick, length) if w >= h else (x + pos, y, length, thick))
            pos += length
        if w >= h:
            x, w = x + thick, w - thick
        else:
            y, h = y + thick, h - thick
        i = j
    return out


def _worst(row: list[float], side: float) -> float:
    s = sum(row)
    if s <= 0:
        return math.inf
    return max(max(side * side * r / (s * s), s * s / (side * side * r)) for r in row if r > 0)


def _groups(tensors: list[dict[str, Any]], most: int = 48) -> list[tuple[str, int, int]]:
    """(module prefix, bytes, tensors) at the deepest prefix depth with at most ``most``
    groups, largest first."""
    best: dict[str, list[int]] = {}
    for depth in range(1, 12):
        found: dict[str, list[int]] = {}
        for t in tensors:
            parts = t["name"].split(".")
            key = ".".join(parts[:min(depth, max(len(parts) - 1, 1))])
            g = found.setdefault(key, [0, 0])
            g[0] += t["nbytes"]
            g[1] += 1
        if len(found) > most:
            break
        best = found
        if all(len(t["name"].split(".")) - 1 <= depth for t in tensors):
            break
    return sorted(((k, v[0], v[1]) for k, v in best.items()), key=lambda g: -g[1])


def _treemap(tensors: list[dict[str, Any]], human: Any) -> str:
    groups = [g for g in _groups(tensors) if g[1] > 0]
    if not groups:
        return "<p class=muted>No tensor bytes.</p>"
    width, height = 960.0, 360.0
    rects = squarify([g[1] for g in groups], (0.0, 0.0, width, height))
    parts = [f'<svg id="treemap" width="{width:.0f}" height="{height:.0f}" '
             f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
             'aria-label="tensor bytes by module prefix">']
    for i, ((name, nbytes, count), (x, y, w, h)) in enumerate(zip(groups, rects, strict=True)):
        hue = (i * 47) % 360
        label = html.escape(name)
        parts.append(f'<g><title>{label}: {human(nbytes)} in {count} tensors</title>'
                     f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" '
                     f'fill="hsl({hue},55%,78%)" stroke="#fff"/>')
        if w > 60 and h > 28:
            parts.append(f'<text x="{x + 4:.1f}" y="{y + 14:.1f}">{label[:int(w / 7)]}</text>'
                         f'<text x="{x + 4:.1f}" y="{y + 27:.1f}">{human(nbytes)}</text>')
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)


def _table(rows: list[dict[str, Any]], human: Any) -> str:
    head = ('<table id="tensors"><thead><tr>'
            '<th data-key="name" data-type="text">name</th>'
            '<th data-key="dtype" data-type="text">dtype</th>'
            '<th data-key="shape" data-type="text">shape</th>'
            '<th data-key="numel" data-type="num" class=num>elements</th>'
            '<th data-key="bytes" data-type="num" class=num>bytes</th>'
            '<th data-key="notes" data-type="text">notes</th></tr></thead><tbody>')
    body = []
    for r in rows:
        name = html.escape(r["name"])
        shape = "x".join(map(str, r["shape"])) or "scalar"
        numel = math.prod(r["shape"])
        notes = " ".join(n for n, on in (("strided", not r["contiguous"]),
                                         ("shared", r["shared_storage"]),
                                         ("param", r["parameter"])) if on)
        body.append(f'<tr><td data-value="{name}">{name}</td>'
                    f'<td data-value="{html.escape(r["dtype"])}">{html.escape(r["dtype"])}</td>'
                    f'<td data-value="{shape}">{shape}</td>'
                    f'<td class=num data-value="{numel}">{numel}</td>'
                    f'<td class=num data-value="{r["nbytes"]}">{human(r["nbytes"])}</td>'
                    f'<td data-value="{notes}">{notes}</td></tr>')
    return head + "".join(body) + "</tbody></table>"


def _findings(scan: dict[str, Any]) -> str:
    """Per scanned file (one, or an index and its shards): its status, error and hint, the
    actions torch.load would take grouped by package (dangerous and unvetted ones), the
    globals it names and the container's anomalies."""
    e = html.escape
    parts: list[str] = []
    for f in scan.get("files", ()):
        status = str(f["status"])
        parts.append(f'<h3><code>{e(f["path"])}</code> <span class="verdict {e(status)}">'
                     f'{e(status)}</span> <span class=muted>{e(f.get("layout") or "")}'
                     '</span></h3>')
        if f.get("error"):
            parts.append(f"<p class=error-text>{e(f['error'])}</p>")
        if f.get("hint"):
            parts.append(f"<p class=muted>{e(f['hint'])}</p>")
        if f["groups"]:
            parts.append('<table class=groups><thead><tr><th>severity</th><th>what '
                         'torch.load would do</th><th>first at</th><th>why</th></tr></thead>'
                         '<tbody>')
            parts.extend(f'<tr class="{e(g["severity"])}"><td>{e(g["severity"])}</td>'
                         f'<td>{e(g["text"])}</td><td><code>{e(g["opcode"])} '
                         f'{e(g["where"])}</code></td><td>{e(g["reason"])}</td></tr>'
                         for g in f["groups"])
            parts.append("</tbody></table>")
        if f["globals"]:
            parts.append('<details class=globals><summary>'
                         f'{len(f["globals"])} globals named</summary><table><thead><tr>'
                         '<th>global</th><th>verdict</th><th>opcode</th><th>at</th>'
                         '<th>why</th></tr></thead><tbody>')
            parts.extend(f'<tr><td><code>{e(g["name"])}</code></td><td>{e(g["verdict"])}'
                         f'</td><td>{e(g["opcode"])}</td><td>{e(g["where"])}</td>'
                         f'<td>{e(g["reason"])}</td></tr>' for g in f["globals"])
            parts.append("</tbody></table></details>")
        if f["anomalies"]:
            parts.append("<ul class=anomalies>" + "".join(
                f"<li>anomaly: {e(a)}</li>" for a in f["anomalies"]) + "</ul>")
    return "".join(parts)


def _records(doc: dict[str, Any]) -> str:
    """Sparse, quantized, nested and meta tensors (records of their parts) and the tensors
    torchless does not read."""
    e = html.escape
    rows = []
    for name, r in doc.get("records", {}).items():
        shape = "x".join(map(str, r["shape"])) if r["shape"] is not None else "?"
        parts = ", ".join(f"{k} {p['dtype']} {'x'.join(map(str, p['shape'])) or 'scalar'}"
                          for k, p in r["parts"].items())
        rows.append(f"<tr><td>{e(name)}</td><td>{e(r['kind'])}</td><td>{e(shape)}</td>"
                    f"<td>{e(parts)}</td></tr>")
    for name, kind in doc.get("unsupported", {}).items():
        if name not in doc.get("records", {}):
            rows.append(f"<tr><td>{e(name)}</td><td>{e(str(kind))}</td><td>?</td>"
                        "<td>not readable</td></tr>")
    if not rows:
        return ""
    return ("<h2>Records</h2><table id=records><thead><tr><th>name</th><th>kind</th>"
            "<th>shape</th><th>parts</th></tr></thead><tbody>" + "".join(rows)
            + "</tbody></table>")


def page(doc: dict[str, Any], scan: dict[str, Any], human: Any) -> str:
    """The report page for ``doc`` (an ``inspect --json`` entry: a file read, or one
    torchless refused, with its ``error``) and ``scan`` (the verdict: ``status`` and, per
    file scanned, its findings)."""
    e = html.escape
    status = str(scan.get("status", "unknown"))
    verdict = f'<span class="verdict {e(status)}" id="verdict">{e(status)}</span>'
    head = ["<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">",
            f"<title>{e(doc['path'])} · torchless inspect</title><style>{_STYLE}</style>"
            f"</head><body><h1>{e(doc['path'])}</h1>"]
    findings = _findings(scan)
    scanned = f"<h2>Scan</h2><div id=findings>{findings}</div>" if findings else ""
    if not doc.get("ok", True):
        return "".join([
            *head, f"<p class=muted>Not read: {e(str(doc.get('error')))}</p>",
            f"<p>Scan verdict: {verdict}</p>",
            f"<p class=muted>{e(str(doc.get('hint') or ''))}</p>", scanned,
            "</body></html>\n"])
    summary = "".join(f"<li>{e(s['text'])}</li>" for s in doc["summary"])
    dtypes = "".join(
        f"<tr><td>{e(dt)}</td><td class=num>{t['count']}</td>"
        f"<td class=num>{human(t['bytes'])}</td></tr>"
        for dt, t in sorted(doc["totals_by_dtype"].items(), key=lambda kv: -kv[1]["bytes"]))
    opaque = "".join(f"<li><code>{e(g)}</code></li>" for g in doc["opaque_globals"])
    also = "".join(f"<li><code>{e(n)}</code></li>" for n in doc.get("also_in_dir", ()))
    refused = doc.get("refused")
    note = "" if not refused else (
        f"<p id=refused class=error-text>Refused: {e(refused['error'])}</p><p class=muted>"
        f"{e(refused['hint'] or '')}</p><p class=muted>For this page only, "
        + ", ".join(f"<code>{e(n)}</code>" for n in refused["kept_inert"])
        + " were kept as inert records (never imported or called), as --allow-global does."
          "</p>")
    return "".join([
        *head, f"<p class=muted>{e(doc['description'])}</p>",
        f"<p>{doc['tensor_count']} tensors, {human(doc['total_bytes'])}. Scan verdict: ",
        verdict, "</p>", note, scanned,
        f"<h2>Summary</h2><ul id=summary>{summary}</ul>" if summary else "",
        "<h2>Bytes by module prefix</h2>", _treemap(doc["tensors"], human),
        "<h2>By dtype</h2><table id=dtypes><thead><tr><th>dtype</th><th class=num>tensors"
        f"</th><th class=num>bytes</th></tr></thead><tbody>{dtypes}</tbody></table>",
        "<h2>Tensors</h2><p class=muted>Click a column to sort.</p>",
        _table(doc["tensors"], human), _records(doc),
        f"<h2>Kept as inert records</h2><ul id=opaque>{opaque}</ul>" if opaque else "",
        f"<h2>Also in the model directory</h2><ul id=also>{also}</ul>" if also else "",
        f"<script>{_SCRIPT}</script></body></html>\n"])
