"""``inspect --html``: one self-contained page (no script, style or font fetched from
anywhere) with the scan verdict, the known structures, the totals by dtype, a treemap of
tensor bytes by module prefix and the tensor table, sortable by any column.

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
.error{background:#ffebe9;color:#a40e26}table{border-collapse:collapse}
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


def page(doc: dict[str, Any], scan: dict[str, Any], human: Any) -> str:
    """The report page for ``doc`` (an ``inspect --json`` document) and ``scan`` (the scan
    verdict: ``status``, ``dangerous`` globals, ``anomalies``)."""
    e = html.escape
    status = str(scan.get("status", "unknown"))
    verdict = [f'<span class="verdict {e(status)}" id="verdict">{e(status)}</span>']
    for g in scan.get("dangerous", ()):
        verdict.append(f"<li>dangerous global: <code>{e(g)}</code></li>")
    for a in scan.get("anomalies", ()):
        verdict.append(f"<li>anomaly: {e(a)}</li>")
    if scan.get("error"):
        verdict.append(f"<li>{e(scan['error'])}</li>")
    summary = "".join(f"<li>{e(s['text'])}</li>" for s in doc["summary"])
    dtypes = "".join(
        f"<tr><td>{e(dt)}</td><td class=num>{t['count']}</td>"
        f"<td class=num>{human(t['bytes'])}</td></tr>"
        for dt, t in sorted(doc["totals_by_dtype"].items(), key=lambda kv: -kv[1]["bytes"]))
    opaque = "".join(f"<li><code>{e(g)}</code></li>" for g in doc["opaque_globals"])
    return "".join([
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">",
        f"<title>{e(doc['path'])} · torchless inspect</title><style>{_STYLE}</style></head>",
        f"<body><h1>{e(doc['path'])}</h1><p class=muted>{e(doc['description'])}</p>",
        f"<p>{doc['tensor_count']} tensors, {human(doc['total_bytes'])}. Scan verdict: ",
        verdict[0], "</p>",
        f"<ul>{''.join(verdict[1:])}</ul>" if len(verdict) > 1 else "",
        f"<h2>Summary</h2><ul id=summary>{summary}</ul>" if summary else "",
        "<h2>Bytes by module prefix</h2>", _treemap(doc["tensors"], human),
        "<h2>By dtype</h2><table id=dtypes><thead><tr><th>dtype</th><th class=num>tensors"
        f"</th><th class=num>bytes</th></tr></thead><tbody>{dtypes}</tbody></table>",
        "<h2>Tensors</h2><p class=muted>Click a column to sort.</p>",
        _table(doc["tensors"], human),
        f"<h2>Kept as inert records</h2><ul>{opaque}</ul>" if opaque else "",
        f"<script>{_SCRIPT}</script></body></html>\n"])
