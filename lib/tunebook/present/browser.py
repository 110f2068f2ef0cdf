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
        remote: remote, errors: window.__errors || []};
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


def rendered(drv: Any, page: Path | str, settle_s: float = 2.0) -> Rendered:
    """Open a local page and report what rendered (after scripts had time to draw)."""
    import time

    url = page if isinstance(page, str) and "://" in page else Path(page).resolve().as_uri()
    drv.get(url)
    time.sleep(settle_s)
    r = drv.execute_script(_CHECK_JS)
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
