"""Headless Chromium driven over the DevTools protocol on a pipe, for the browser tests.

`--remote-debugging-pipe`: JSON messages ending in NUL on file descriptors 3 and
4, so the tests need only the browser, no driver package. `BROWSER` is None
where no Chromium is installed (`apt-get install chromium`; CI installs it).
"""

import fcntl
import json
import os
import select
import shutil
import subprocess
import time

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((path for path in map(shutil.which, BROWSERS) if path), None)

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-pipe",
)


def _above_4(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class Chromium:
    """Just enough of the DevTools protocol over a pipe to load a page and look at it."""

    def __init__(self, profile_dir):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The protocol wants the pipe on descriptors 3 (commands in) and 4 (replies
        # out); bash moves them there, so no preexec_fn runs in the forked child.
        # The child's ends first move to 10 and up, clear of 3 and 4.
        to_browser_r, from_browser_w = (_above_4(fd) for fd in (to_browser_r, from_browser_w))
        script = (
            f'exec "$@" 3<&{to_browser_r} 4>&{from_browser_w} {to_browser_r}<&- {from_browser_w}>&-'
        )
        self.proc = subprocess.Popen(
            [
                "bash",
                "-c",
                script,
                "bash",
                BROWSER,
                *FLAGS,
                f"--user-data-dir={profile_dir}",
                "about:blank",
            ],
            pass_fds=(to_browser_r, from_browser_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf, self._next_id, self.events = b"", 0, []

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def send(
        self, method: str, params: dict | None = None, session: str | None = None, timeout=60
    ) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout=60) -> dict:
        deadline = time.monotonic() + timeout
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            event = self._read_message(deadline)
            self.events.append(event)
            if event.get("method") == method:
                return event

    def close(self):
        try:
            self.send("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


def open_page(browser: Chromium, url: str, width: int, height: int, mobile: bool) -> str:
    target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
        "sessionId"
    ]
    for domain in ("Runtime", "Log", "Network", "Page"):
        browser.send(f"{domain}.enable", session=session)
    browser.send(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
        session=session,
    )
    browser.events.clear()
    browser.send("Page.navigate", {"url": url}, session=session)
    browser.wait_for("Page.loadEventFired")
    return session


def evaluate(browser: Chromium, session: str, expression: str):
    result = browser.send(
        "Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=session
    )
    assert "exceptionDetails" not in result, result
    return result["result"]["value"]


def problems(events: list[dict]) -> list[str]:
    """Console errors and warnings, uncaught exceptions, error log entries, failed loads."""
    out = []
    for e in events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            out.append(f"exception: {params['exceptionDetails'].get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in (
            "error",
            "warning",
            "assert",
        ):
            out.append(f"console.{params['type']}: {params.get('args')}")
        elif method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
            out.append(f"log {params['entry']['level']}: {params['entry'].get('text')}")
        elif method == "Network.loadingFailed":
            out.append(f"load failed: {params.get('errorText')}")
    return out
