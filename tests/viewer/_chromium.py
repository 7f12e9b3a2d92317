"""A headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``):
no driver package, no port, no browser download; only the system's ``chromium``.

Messages are JSON objects ended by a NUL byte: the browser reads commands from its fd 3 and
writes replies and events to its fd 4.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--remote-debugging-pipe",
)  # fmt: skip


def find_chromium() -> str | None:
    explicit = os.environ.get("EXPORTIR_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else None
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _high(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


class BrowserError(RuntimeError):
    pass


class Browser:
    """One browser with one page. ``errors`` collects console errors, uncaught exceptions and
    log entries of level error (CSP violations, failed loads) seen so far."""

    def __init__(self, executable: str, width: int = 1400, height: int = 900) -> None:
        self._profile = tempfile.mkdtemp(prefix="exportir-chromium-")
        self._log = open(Path(self._profile + ".log"), "wb")  # noqa: SIM115 (closed in close())
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # above fd 9, so that moving one to fd 3 or 4 cannot overwrite the other
        to_browser_r, from_browser_w = (_high(to_browser_r), _high(from_browser_w))
        # the browser's fds 3 and 4 must be these pipes: a small Python trampoline moves them
        # there and execs the browser (no preexec_fn in this process, no shell fd limits)
        trampoline = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4);"
                      " os.execv(sys.argv[3], sys.argv[3:])")
        self.process = subprocess.Popen(
            [sys.executable, "-c", trampoline, str(to_browser_r), str(from_browser_w),
             executable, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log,
            pass_fds=(to_browser_r, from_browser_w),
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.session: str | None = None
        try:
            self._attach(width, height)
        except (BrowserError, OSError):
            self.close()
            raise

    def _attach(self, width: int, height: int) -> None:
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    # -- protocol ---------------------------------------------------------------------------------

    def _read(self, timeout: float) -> dict[str, Any] | None:
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_browser], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError(f"the browser closed its pipe; its log ends:\n{self.log_tail()}")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message = json.loads(raw)
        if "method" in message:
            self._note(message)
        return message

    def _note(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text")
            self.errors.append(f"uncaught: {text}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            self.errors.append(f"console.{params['type']}: {args}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            self.errors.append(f"log: {params['entry'].get('text')}")

    def call(self, method: str, timeout: float = 60.0, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if self.session is not None:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            reply = self._read(max(left, 0)) if left > 0 else None
            if reply is None:
                raise BrowserError(f"no reply to {method} within {timeout} s")
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def wait_event(self, method: str, timeout: float = 60.0) -> dict[str, Any]:
        seen = len(self.events)
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events[seen:]:
                if event["method"] == method:
                    return event
            seen = len(self.events)
            left = deadline - time.monotonic()
            if left <= 0 or self._read(left) is None:
                raise BrowserError(f"no {method} within {timeout} s")

    # -- page helpers ------------------------------------------------------------------------------

    def open(self, path: Path, timeout: float = 120.0) -> None:
        self.call("Page.navigate", url=path.resolve().as_uri())
        self.wait_event("Page.loadEventFired", timeout)

    def evaluate(self, expression: str, timeout: float = 120.0) -> Any:
        result = self.call("Runtime.evaluate", timeout=timeout, expression=expression,
                           returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click in the middle of the first element ``selector`` matches.

        The element is first scrolled into view, as a user scrolls a side panel to reach a button;
        how far down it sits depends on the machine's fonts and window size.
        """
        box = self.evaluate(
            "(() => { const e = document.querySelector(" + json.dumps(selector) + ");"
            " if (!e) return null; e.scrollIntoView({block: 'center', inline: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        if box is None:
            raise BrowserError(f"nothing matches {selector!r}")
        x, y = box
        width, height = self.evaluate("[window.innerWidth, window.innerHeight]")
        if not (0 <= x < width and 0 <= y < height):
            raise BrowserError(f"{selector!r} is off screen at ({x:.0f}, {y:.0f})")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left",
                      clickCount=1 if kind != "mouseMoved" else 0)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def log_tail(self, lines: int = 20) -> str:
        self._log.flush()
        text = Path(self._log.name).read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def close(self) -> None:
        try:
            self.session = None
            self.call("Browser.close", timeout=10)
        except (BrowserError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:  # noqa: PYI034 (Python 3.10 has no typing.Self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
