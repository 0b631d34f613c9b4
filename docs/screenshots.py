"""The docs' pictures, taken by headless Chromium from real runs: `make docs-images`.

Trains two runs of 4 seeds on the real MNIST (`tpu101`, and the same with a cosine schedule),
compares them, runs a small hyperparameter search, and serves the first run; then
photographs each page jaxmnist wrote with Chromium's own `--screenshot`, and the served
page after drawing a 7 on its pad with the mouse (over the DevTools pipe the browser tests
use), into docs/images/: report.png, compare.png, search.png, serve.png. Nothing is drawn by hand,
so a page that changes shows as changed pictures the next time this runs. Needs the
datasets (`JAXMNIST_DATA_DIR` or the cache), the `serve` and `search` extras, and
Chromium (`apt-get install chromium`). Usage: python docs/screenshots.py [--work DIR]
"""

from __future__ import annotations

import argparse
import base64
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

IMAGES = Path(__file__).resolve().parent / "images"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WIDTH = 1200


def jaxmnist(work: Path, *args: str) -> None:
    """`jaxmnist ARGS` run in folder `work` (the pages show the runs' paths from there)."""
    command = [sys.executable, "-m", "jaxmnist", *args]
    print("$ jaxmnist " + " ".join(args), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=work)


def screenshot(browser: str, url: str, out: Path, height: int) -> None:
    """`url` as Chromium draws it in a WIDTH x `height` window, into PNG `out`."""
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                f"--user-data-dir={profile}",
                f"--window-size={WIDTH},{height}",
                "--virtual-time-budget=5000",  # the page's scripts run before the picture
                f"--screenshot={out}",
                url,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
        )
    print(f"{out.relative_to(IMAGES.parent.parent)}: {url}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def draw_a_seven(url: str, out: Path, width: int = WIDTH, height: int = 500) -> None:
    """Opens the serve page at `url` in Chromium driven over its DevTools pipe (the
    browser tests' driver, tests/chromium.py), draws a 7 on the pad with the mouse,
    waits for the prediction and writes the page as PNG `out`."""
    sys.path.insert(0, str(IMAGES.parent.parent / "tests"))
    from chromium import Chromium, evaluate, open_page  # the tests' driver: no package

    points = [(0.25, 0.2), (0.75, 0.2), (0.6, 0.5), (0.45, 0.85)]
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        browser = Chromium(profile)
        try:
            session = open_page(browser, url, width, height, mobile=False)

            def wait(expression: str, what: str) -> None:
                deadline = time.monotonic() + 60
                while not evaluate(browser, session, expression):
                    if time.monotonic() > deadline:
                        raise SystemExit(f"the serve page did not {what}")
                    time.sleep(0.1)

            # The pad shows once the model's description has loaded.
            wait("!document.getElementById('draw').hidden", "show its pad")
            box = evaluate(
                browser,
                session,
                "(r => ({x: r.x, y: r.y, w: r.width, h: r.height}))("
                "document.querySelector('#pad').getBoundingClientRect())",
            )
            xy = []
            for (x0, y0), (x1, y1) in itertools.pairwise(points):
                xy += [(x0 + t * (x1 - x0) / 12, y0 + t * (y1 - y0) / 12) for t in range(12)]
            xy = [
                (box["x"] + fx * box["w"], box["y"] + fy * box["h"]) for fx, fy in [*xy, points[-1]]
            ]
            for i, (x, y) in enumerate(xy):
                kind = "mousePressed" if i == 0 else "mouseMoved"
                browser.send(
                    "Input.dispatchMouseEvent",
                    {"type": kind, "x": x, "y": y, "button": "left", "buttons": 1, "clickCount": 1},
                    session=session,
                )
            browser.send(
                "Input.dispatchMouseEvent",
                {"type": "mouseReleased", "x": xy[-1][0], "y": xy[-1][1], "button": "left",
                 "clickCount": 1},
                session=session,
            )  # fmt: skip
            wait(
                "document.body.dataset.state === 'idle' && "
                "!!document.getElementById('top').dataset.class",
                "predict the drawing",
            )
            time.sleep(0.5)  # the bars' transition
            shot = browser.send("Page.captureScreenshot", {"format": "png"}, session=session)
            out.write_bytes(base64.b64decode(shot["data"]))
        finally:
            browser.close()
    print(f"{out.relative_to(IMAGES.parent.parent)}: {url}, a 7 drawn on the pad", flush=True)


def served(run: Path, browser: str, out: Path) -> None:
    """Starts `jaxmnist serve` on `run`, draws a 7 on its page, photographs it, stops it."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "jaxmnist", "serve", run.name, "--port", str(port)],
        cwd=run.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("jaxmnist serve did not start") from None
                time.sleep(0.5)
        draw_a_seven(f"http://127.0.0.1:{port}/", out)
    finally:
        server.terminate()
        server.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, help="folder for the runs (default: a temporary one)")
    args = p.parse_args(argv)
    browser = next((b for b in map(shutil.which, BROWSERS) if b), None)
    if browser is None:
        sys.exit("no Chromium found: apt-get install chromium")
    work = (args.work or Path(tempfile.mkdtemp(prefix="jaxmnist-screenshots-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    runs = work / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    a, search = runs / "tpu101", runs / "search"
    # 4 seeds each, so that the compare page has a test of the difference to show.
    jaxmnist(work, "train", "--preset", "tpu101", "--seeds", "4", "--run-dir", "runs/tpu101")
    jaxmnist(
        work, "train", "--preset", "tpu101", "--seeds", "4", "--schedule", "cosine",
        "--run-dir", "runs/tpu101-cosine",
    )  # fmt: skip
    jaxmnist(work, "compare", "runs/tpu101", "runs/tpu101-cosine", "--out", "runs/compare.html")
    jaxmnist(
        work, "search", "--preset", "tpu101", "--epochs", "2", "--trials", "8",
        "--param", "optimizer.lr=log:1e-4:1e-1", "--out", "runs/search",
    )  # fmt: skip
    IMAGES.mkdir(exist_ok=True)
    screenshot(browser, (a / "report.html").as_uri(), IMAGES / "report.png", 1600)
    screenshot(browser, (runs / "compare.html").as_uri(), IMAGES / "compare.png", 1400)
    screenshot(browser, (search / "search.html").as_uri(), IMAGES / "search.png", 1400)
    served(a, browser, IMAGES / "serve.png")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
