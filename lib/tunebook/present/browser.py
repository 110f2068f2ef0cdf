"""Headless Chromium with the network off, for checking that rendered pages work offline, for
the screenshots in docs/ (scripts/screenshots.py) and for printing a report to PDF
(`tunebook export EXPERIMENT --pdf`). Uses Debian's `chromium` and `chromedriver` packages
through selenium; nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> tuple[str, str] | None:
    """(browser, chromedriver) paths, or None when either is missing."""
    browser = next((p for p in map(shutil.which, CHROMIUM_CANDIDATES) if p), None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@contextlib.contextmanager
def chromium(offline: bool = True, width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A selenium WebDriver on headless Chromium. ``offline``: every name resolves to nothing,
    all traffic goes to a dead proxy, and DevTools' network emulation is set to offline, so
    a page that needs the internet visibly fails."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = find_chromium()
    if found is None:
        raise FileNotFoundError("headless Chromium (checks, screenshots, PDF) needs Debian's "
                                "chromium and chromedriver: apt-get install chromium "
                                "chromium-driver")
    browser, driver_path = found
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--hide-scrollbars",
                "--allow-file-access-from-files"):
        opts.add_argument(arg)
    if offline:
        opts.add_argument("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost")
        opts.add_argument("--proxy-server=http://127.0.0.1:9")
        opts.add_argument("--proxy-bypass-list=<-loopback>")
    drv = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        if offline:
            drv.execute_cdp_cmd("Network.enable", {})
            drv.execute_cdp_cmd("Network.emulateNetworkConditions", {
                "offline": True, "latency": 0, "downloadThroughput": -1,
                "uploadThroughput": -1})
        yield drv
    finally:
        drv.quit()


# Counts what a reader would see: inline SVG images that decoded, <svg> elements with
# drawn marks, and canvases (vega-embed's default) with at least one non-blank pixel.
_CHECK_JS = """
const imgs = [...document.querySelectorAll('img')].filter(i => i.src.startsWith('data:image/svg'));
const okImgs = imgs.filter(i => i.complete && i.naturalWidth > 0 && i.naturalHeight > 0);
const svgs = [...document.querySelectorAll('svg')].filter(
  s => s.querySelectorAll('path, rect, circle, line, text').length > 0
       && s.getBoundingClientRect().width > 0);
let canvases = 0;
for (const c of document.querySelectorAll('canvas')) {
  if (!c.width || !c.height) continue;
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  for (let i = 3; i < d.length; i += 4) { if (d[i] !== 0) { canvases++; break; } }
}
const remote = performance.getEntriesByType('resource').map(e => e.name)
  .filter(n => /^https?:/.test(n));
return {images: imgs.length, images_ok: okImgs.length, svgs: svgs.length, canvases: canvases,
        remote: remote, errors: window.__errors || [],
        ready: document.readyState === 'complete'};
"""


@dataclass
class Rendered:
    images: int  # inline SVG images on the page
    images_ok: int  # ... of which decoded with a size
    svgs: int  # <svg> elements with marks
    canvases: int  # canvases with drawn pixels
    remote: list[str]  # http(s) resources the page tried to fetch

    @property
    def charts(self) -> int:
        return self.images_ok + self.svgs + self.canvases


def rendered(drv: Any, page: Path | str, settle_s: float = 2.0,
             quiet_s: float = 0.4) -> Rendered:
    """Open a local page and report what rendered once its scripts have drawn: the page
    loaded and what it shows unchanged for `quiet_s`, or `settle_s` at most (a page that
    draws nothing waits that long; one that draws is read as soon as it stops changing,
    instead of after a fixed wait: ~0.5 s a report against 2 s)."""
    import time

    url = page if isinstance(page, str) and "://" in page else Path(page).resolve().as_uri()
    drv.get(url)
    t0 = time.monotonic()
    seen, since = None, t0
    while True:
        r = drv.execute_script(_CHECK_JS)
        now = time.monotonic()
        shown = (r["images"], r["images_ok"], r["svgs"], r["canvases"], r["ready"])
        if shown != seen:
            seen, since = shown, now
        drew = r["ready"] and r["images_ok"] + r["svgs"] + r["canvases"] > 0
        if now - t0 >= settle_s or (drew and now - since >= quiet_s):
            break
        time.sleep(0.1)
    return Rendered(r["images"], r["images_ok"], r["svgs"], r["canvases"], r["remote"])


# Before printing: every <details> open (a PDF cannot be clicked), and the page laid out.
_UNFOLD_JS = "document.querySelectorAll('details').forEach(d => { d.open = true; });"


def print_pdf(page: Path | str, out: Path | str, settle_s: float = 0.5) -> Path:
    """Print a local page to PDF, offline, with its backgrounds (the verdicts' colours) and
    without the browser's header and footer (they would show this machine's path and the
    date); every ``<details>`` block unfolded. Written atomically; returns ``out``."""
    import base64
    import time

    from tunebook.results.store import replace_atomic

    with chromium(offline=True) as drv:
        drv.get(Path(page).resolve().as_uri())
        time.sleep(settle_s)
        drv.execute_script(_UNFOLD_JS)
        pdf = drv.execute_cdp_cmd("Page.printToPDF", {
            "printBackground": True, "displayHeaderFooter": False,
            "preferCSSPageSize": True})
    return replace_atomic(Path(out), base64.b64decode(pdf["data"]))


# --- axis labels that collide or are cut off ------------------------------------------------
# For each <svg> on the page: every axis's label texts (Vega's `role-axis-label` group), each
# as the four corners of its box in page coordinates (a rotated label's box turns with it);
# a pair of labels of one axis whose boxes intersect (separating-axis test) is an overlap, a
# label whose box leaves its SVG's box is cut off. `tol` px of touching is allowed (glyph boxes
# include the font's ascent and descent, wider than the ink).
_LABELS_JS = """
const tol = arguments[0];
function corners(t) {
  const b = t.getBBox(), m = t.getScreenCTM();
  return [[b.x, b.y], [b.x + b.width, b.y], [b.x + b.width, b.y + b.height],
          [b.x, b.y + b.height]].map(([x, y]) => [m.a * x + m.c * y + m.e,
                                                  m.b * x + m.d * y + m.f]);
}
function shrink(q, by) {  // each corner moved `by` px towards the box's centre
  const cx = q.reduce((s, p) => s + p[0], 0) / 4, cy = q.reduce((s, p) => s + p[1], 0) / 4;
  return q.map(([x, y]) => {
    const dx = cx - x, dy = cy - y, d = Math.hypot(dx, dy) || 1;
    return [x + dx / d * Math.min(by, d), y + dy / d * Math.min(by, d)];
  });
}
function apart(a, b) {  // separating axis theorem on two convex quadrilaterals
  for (const q of [a, b]) {
    for (let i = 0; i < 4; i++) {
      const p1 = q[i], p2 = q[(i + 1) % 4];
      const nx = p2[1] - p1[1], ny = p1[0] - p2[0];
      const pa = a.map(p => p[0] * nx + p[1] * ny), pb = b.map(p => p[0] * nx + p[1] * ny);
      if (Math.max(...pa) <= Math.min(...pb) || Math.max(...pb) <= Math.min(...pa)) return true;
    }
  }
  return false;
}
const out = [];
document.querySelectorAll('svg').forEach((svg, si) => {
  if (svg.parentElement && svg.parentElement.closest('svg')) return;
  const box = svg.getBoundingClientRect();
  const name = svg.getAttribute('data-name') || String(si);
  svg.querySelectorAll('g.role-axis-label').forEach((axis, ai) => {
    const labels = [...axis.querySelectorAll('text')]
      .filter(t => t.textContent.trim() && t.getAttribute('opacity') !== '0')
      .map(t => ({text: t.textContent, q: corners(t)}));
    for (const l of labels) {
      const xs = l.q.map(p => p[0]), ys = l.q.map(p => p[1]);
      if (Math.min(...xs) < box.left - tol || Math.max(...xs) > box.right + tol
          || Math.min(...ys) < box.top - tol || Math.max(...ys) > box.bottom + tol)
        out.push({chart: name, axis: ai, kind: 'cut off', labels: [l.text]});
    }
    for (let i = 0; i < labels.length; i++)
      for (let j = i + 1; j < labels.length; j++)
        if (!apart(shrink(labels[i].q, tol), shrink(labels[j].q, tol)))
          out.push({chart: name, axis: ai, kind: 'overlap',
                    labels: [labels[i].text, labels[j].text]});
  });
});
return out;
"""


@dataclass(frozen=True)
class LabelProblem:
    chart: str  # the chart's name on the page (its data-name, else its position)
    axis: int  # which axis of that chart (its position among the chart's axes)
    kind: str  # "overlap" or "cut off"
    labels: tuple[str, ...]  # the label(s) concerned

    def __str__(self) -> str:
        return f"{self.chart}, axis {self.axis}: {self.kind}: " + " / ".join(
            repr(t) for t in self.labels)


def report_svgs(html: str) -> list[str]:
    """The SVG images of a rendered report (inline ``data:image/svg+xml`` images), decoded."""
    import base64
    import re
    from urllib.parse import unquote

    out = []
    for m in re.finditer(r'src="data:image/svg\+xml(;base64)?,([^"]+)"', html):
        data = base64.b64decode(m[2]).decode("utf-8") if m[1] else unquote(m[2])
        if "role-axis" in data:  # a chart (icons and other images have no axes)
            out.append(data)
    return out


def label_problems(drv: Any, svgs: dict[str, str], workdir: Path,
                   tol: float = 1.0) -> list[LabelProblem]:
    """Axis labels that overlap another label of their axis, or leave their chart, in each
    SVG of ``svgs`` (name -> SVG markup) as Chromium lays them out: all on one page written
    to ``workdir``, each SVG at its own size."""
    import html as html_lib
    import re

    parts = []
    for name, svg in svgs.items():
        svg = re.sub(r"<\?xml[^>]*>", "", svg)
        svg = svg.replace("<svg ", f'<svg data-name="{html_lib.escape(name)}" ', 1)
        parts.append(f'<div style="margin:8px 0">{svg}</div>')
    page = Path(workdir) / "labels.html"
    page.write_text("<!doctype html><html><head><meta charset='utf-8'></head><body>"
                    + "\n".join(parts) + "</body></html>", encoding="utf-8")
    drv.get(page.resolve().as_uri())
    found = drv.execute_script(_LABELS_JS, tol)
    return [LabelProblem(p["chart"], int(p["axis"]), p["kind"], tuple(p["labels"]))
            for p in found]
