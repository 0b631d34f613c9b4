"""The report in a real browser: headless Chromium opens it from disk.

Chromium is driven over the DevTools protocol on a pipe (`chromium.py`), so the
test needs only the browser, no driver package. It records every console message, uncaught
exception, log entry and network request while the page loads, then checks
that there were no errors, that nothing but the file itself and data: URIs was
fetched, that every image decoded, that the page fits a phone's width, and that
a screenshot is not blank. Skipped, saying why, only where no Chromium is
installed (`apt-get install chromium`; CI installs it).
"""

import base64
import io
import time

import numpy as np
import pytest
from chromium import BROWSER, Chromium, evaluate, open_page, problems
from test_report import other_run, tiny_run

from jaxmnist.report.compare import write_comparison
from jaxmnist.report.run_report import write_run_report

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install chromium)"),
]


def check_page(tmp_path, page, width: int, height: int, mobile: bool) -> np.ndarray:
    from PIL import Image

    browser = Chromium(tmp_path / f"profile-{width}")
    try:
        url = page.resolve().as_uri()
        session = open_page(browser, url, width, height, mobile)
        images = evaluate(
            browser, session, "Array.from(document.images).map(i => [i.complete, i.naturalWidth])"
        )
        overflow = evaluate(
            browser, session, "document.documentElement.scrollWidth - window.innerWidth"
        )
        shot = browser.send("Page.captureScreenshot", {"format": "png"}, session=session)["data"]
        time.sleep(0.2)  # let late console messages arrive
        browser.send("Runtime.evaluate", {"expression": "1"}, session=session)
        events = list(browser.events)
    finally:
        browser.close()
    assert problems(events) == []
    requested = [
        e["params"]["request"]["url"]
        for e in events
        if e.get("method") == "Network.requestWillBeSent"
    ]
    assert requested and all(u == url or u.startswith("data:") for u in requested), requested
    assert images and all(done and w > 0 for done, w in images), images
    assert overflow <= 0, f"the page is {overflow}px wider than a {width}px screen"
    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(shot))).convert("RGB"))
    assert pixels.shape[:2] == (height, width)
    assert pixels.std() > 10 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50, (
        "blank screenshot"
    )
    return pixels


@pytest.fixture(scope="module")
def pages(tmp_path_factory, tiny_dataset):
    a, b = tiny_run(tmp_path_factory, tiny_dataset), other_run(tmp_path_factory, tiny_dataset)
    out = tmp_path_factory.mktemp("browser")
    return {
        "report": write_run_report(a, out / "report.html"),
        "comparison": write_comparison([a, b], out / "comparison.html"),
    }


@pytest.mark.parametrize("kind", ["report", "comparison"])
@pytest.mark.parametrize("width, height, mobile", [(1280, 900, False), (390, 844, True)])
def test_page_opens_from_disk_without_errors(pages, tmp_path, kind, width, height, mobile):
    check_page(tmp_path, pages[kind], width, height, mobile)
