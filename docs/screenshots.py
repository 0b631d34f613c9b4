"""The docs' pictures, taken by headless Chromium from real runs: `make docs-images`.

Trains two runs of 4 seeds on the real MNIST (`tpu101`, and the same with a cosine schedule),
compares them, runs a small hyperparameter search, and serves the first run; then
photographs each page jaxmnist wrote or serves with Chromium's own `--screenshot` into
docs/images/: report.png, compare.png, search.png, serve.png. Nothing is drawn by hand,
so a page that changes shows as changed pictures the next time this runs. Needs the
datasets (`JAXMNIST_DATA_DIR` or the cache), the `serve` and `search` extras, and
Chromium (`apt-get install chromium`). Usage: python docs/screenshots.py [--work DIR]
"""

from __future__ import annotations

import argparse
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


def served(run: Path, browser: str, out: Path) -> None:
    """Starts `jaxmnist serve` on `run`, photographs its page, and stops it."""
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
        screenshot(browser, f"http://127.0.0.1:{port}/", out, 500)
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
