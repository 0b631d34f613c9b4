"""The served page in a real browser, used as a person would use it.

Headless Chromium (`chromium.py`) opens the page of a running server, draws a
"1" and then a "7" on the canvas with real input events (a mouse at desktop
width, a finger at a phone's 390 px), reads the class the page shows, uploads a
photo-like image of a digit through the file button, and checks that there were
no console errors and that no request left 127.0.0.1. The model is a short
real-MNIST run (skipped without real MNIST); a Fashion-MNIST model's page must
offer a drop zone and its class names instead of a drawing pad.
"""

import base64
import io
import itertools
import json
import shutil
import threading
import time

import numpy as np
import pytest
from chromium import BROWSER, Chromium, evaluate, open_page, problems
from PIL import Image

from jaxmnist.use import predict
from jaxmnist.use.serve import server as server_lib

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install chromium)"),
]


# Which of the drawing pad and the drop zone a person can see.
VISIBLE = (
    "Object.fromEntries(['draw', 'drop'].map(id =>"
    " [id, getComputedStyle(document.getElementById(id)).display !== 'none']))"
)


class LiveServer:
    """`jaxmnist serve` of a run, on a free loopback port, in a background thread."""

    def __init__(self, run_dir):
        sock = server_lib.bind("127.0.0.1", 0)
        self.url = server_lib.url_of(sock)
        self.server = server_lib.make_server(predict.load_trained(run_dir), sock, "127.0.0.1")
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]})
        self.thread.start()

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def mnist_server(real_mnist_run):
    live = LiveServer(real_mnist_run)
    yield live.url
    live.stop()


def wait_idle(browser, session, timeout=30.0, shown=None) -> str:
    """Waits until the page's answer is current (and, if given, shows class `shown`:
    "" for none); returns the class index it shows."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state, now = evaluate(
            browser,
            session,
            "[document.body.dataset.state, document.getElementById('top').dataset.class]",
        )
        if state == "idle" and shown in (None, now):
            return now
        time.sleep(0.05)
    raise TimeoutError("the page did not finish predicting")


def rect(browser, session, selector: str) -> dict:
    return evaluate(
        browser,
        session,
        f"(r => ({{x: r.x, y: r.y, w: r.width, h: r.height}}))("
        f"document.querySelector({json.dumps(selector)}).getBoundingClientRect())",
    )


def stroke(browser, session, box: dict, points, touch: bool) -> None:
    """One stroke through `points` (fractions of `box`), densely interpolated."""
    xy = []
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        for t in np.linspace(0, 1, 12, endpoint=False):
            xy.append((x0 + t * (x1 - x0), y0 + t * (y1 - y0)))
    xy.append(points[-1])
    xy = [(box["x"] + fx * box["w"], box["y"] + fy * box["h"]) for fx, fy in xy]
    if touch:
        for kind, (x, y) in [("touchStart", xy[0]), *(("touchMove", p) for p in xy[1:])]:
            browser.send(
                "Input.dispatchTouchEvent",
                {"type": kind, "touchPoints": [{"x": x, "y": y}]},
                session=session,
            )
        browser.send("Input.dispatchTouchEvent", {"type": "touchEnd", "touchPoints": []}, session)
        return
    mouse = {"button": "left", "clickCount": 1}
    browser.send(
        "Input.dispatchMouseEvent",
        {"type": "mousePressed", "x": xy[0][0], "y": xy[0][1], **mouse},
        session=session,
    )
    for x, y in xy[1:]:
        browser.send(
            "Input.dispatchMouseEvent",
            {"type": "mouseMoved", "x": x, "y": y, "buttons": 1, "button": "left"},
            session=session,
        )
    browser.send(
        "Input.dispatchMouseEvent",
        {"type": "mouseReleased", "x": xy[-1][0], "y": xy[-1][1], **mouse},
        session=session,
    )


def tap(browser, session, selector: str, touch: bool) -> None:
    """A click, or with `touch` a finger's tap (which the browser turns into a click)."""
    box = rect(browser, session, selector)
    x, y = box["x"] + box["w"] / 2, box["y"] + box["h"] / 2
    if touch:
        time.sleep(0.5)  # past the double-tap window of the stroke before, or it is no click
        for kind, points in (("touchStart", [{"x": x, "y": y}]), ("touchEnd", [])):
            browser.send(
                "Input.dispatchTouchEvent", {"type": kind, "touchPoints": points}, session=session
            )
        return
    for kind, button in (
        ("mouseMoved", "none"),
        ("mousePressed", "left"),
        ("mouseReleased", "left"),
    ):
        browser.send(
            "Input.dispatchMouseEvent",
            {"type": kind, "x": x, "y": y, "button": button, "clickCount": 1},
            session=session,
        )


def upload(browser, session, path) -> None:
    root = browser.send("DOM.getDocument", session=session)["root"]["nodeId"]
    node = browser.send(
        "DOM.querySelector", {"nodeId": root, "selector": "#file"}, session=session
    )["nodeId"]
    browser.send("DOM.setFileInputFiles", {"nodeId": node, "files": [str(path)]}, session=session)


def check_network_and_console(browser, session, url: str) -> list[str]:
    time.sleep(0.2)  # let late console messages arrive
    browser.send("Runtime.evaluate", {"expression": "1"}, session=session)
    events = list(browser.events)
    assert problems(events) == []
    requested = [
        e["params"]["request"]["url"]
        for e in events
        if e.get("method") == "Network.requestWillBeSent"
    ]
    assert any("/api/predict" in u for u in requested), requested
    outside = [
        u for u in requested if not u.startswith(url) and not u.startswith(("data:", "blob:"))
    ]
    assert outside == [], outside
    return requested


def screenshot(browser, session, width: int, height: int) -> np.ndarray:
    shot = browser.send("Page.captureScreenshot", {"format": "png"}, session=session)["data"]
    pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(shot))).convert("RGB"))
    assert pixels.shape[:2] == (height, width)
    return pixels


def digit_photo(path, image_u8: np.ndarray) -> None:
    """A test digit as dark ink on light paper, enlarged and off-centre, as a photo might be."""
    digit = Image.fromarray(255 - image_u8).resize((150, 150), Image.Resampling.BICUBIC)
    page = Image.new("RGB", (360, 300), (240, 238, 230))
    page.paste(digit.convert("RGB"), (40, 90))
    page.save(path)


@pytest.mark.realdata
@pytest.mark.parametrize(
    "width, height, touch", [(1280, 900, False), (390, 844, True)], ids=["desktop", "phone"]
)
def test_draw_a_1_and_a_7_then_upload_a_digit(mnist_server, tmp_path, width, height, touch):
    from jaxmnist.data import load_dataset

    test = load_dataset("mnist", download=False)
    photo = tmp_path / "digit.png"
    digit_photo(photo, test.test_images[0])  # a 7
    browser = Chromium(tmp_path / "profile")
    try:
        session = open_page(browser, mnist_server, width, height, mobile=touch)
        if touch:
            browser.send(
                "Emulation.setTouchEmulationEnabled",
                {"enabled": True, "maxTouchPoints": 1},
                session=session,
            )
        assert wait_idle(browser, session) == ""
        assert evaluate(browser, session, VISIBLE) == {"draw": True, "drop": False}
        pad = rect(browser, session, "#pad")
        assert pad["x"] >= 0 and pad["x"] + pad["w"] <= width

        one = [(0.52, 0.15), (0.5, 0.5), (0.48, 0.85)]
        # Clear at once, while answers to the stroke are still out: none may show after it.
        stroke(browser, session, pad, one, touch)
        tap(browser, session, "#clear", touch)
        time.sleep(0.5)
        assert wait_idle(browser, session) == ""
        stroke(browser, session, pad, one, touch)
        shown_one = wait_idle(browser, session)
        tap(browser, session, "#clear", touch)
        assert wait_idle(browser, session, shown="") == ""  # a tap's click may come later
        stroke(browser, session, pad, [(0.25, 0.2), (0.75, 0.2), (0.6, 0.5), (0.45, 0.85)], touch)
        shown_seven = wait_idle(browser, session)
        seen = evaluate(
            browser,
            session,
            "Array.from(document.getElementById('seen').getContext('2d')"
            ".getImageData(0, 0, 28, 28).data)",
        )
        upload(browser, session, photo)
        time.sleep(0.1)
        shown_upload = wait_idle(browser, session)
        overflow = evaluate(
            browser, session, "document.documentElement.scrollWidth - window.innerWidth"
        )
        pixels = screenshot(browser, session, width, height)
        check_network_and_console(browser, session, mnist_server)
    finally:
        browser.close()
    assert (shown_one, shown_seven, shown_upload) == ("1", "7", str(test.test_labels[0]))
    assert np.asarray(seen).reshape(28, 28, 4)[..., 0].max() == 255  # the model's view is shown
    assert overflow <= 0, f"the page is {overflow}px wider than a {width}px screen"
    assert pixels.std() > 10, "blank screenshot"


def test_fashion_page_offers_a_drop_zone_not_a_pad(tiny_model_run, tmp_path):
    """A model of clothes: class names and an upload, no drawing."""
    run = shutil.copytree(tiny_model_run, tmp_path / "fashion-run")
    config = json.loads((run / "config.json").read_text())
    config["data"]["dataset"] = "fashion_mnist"
    (run / "config.json").write_text(json.dumps(config))
    live = LiveServer(run)
    photo = tmp_path / "shirt.png"
    Image.new("RGB", (90, 120), "white").save(photo)
    browser = Chromium(tmp_path / "profile")
    try:
        session = open_page(browser, live.url, 390, 844, mobile=True)
        wait_idle(browser, session)
        visible, text, labels = evaluate(
            browser,
            session,
            f"[{VISIBLE}, document.getElementById('drop').textContent,"
            " Array.from(document.querySelectorAll('.label')).map(e => e.textContent)]",
        )
        upload(browser, session, photo)
        time.sleep(0.1)
        shown = wait_idle(browser, session)
        check_network_and_console(browser, session, live.url)
    finally:
        browser.close()
        live.stop()
    assert visible == {"draw": False, "drop": True}
    assert "Fashion-MNIST" in text and "Ankle boot" in text
    assert labels[0] == "T-shirt/top" and len(labels) == 10
    assert shown in {str(i) for i in range(10)}
