"""Open a page in headless Chromium and report what a reader's browser would see.

Chromium is driven through the DevTools protocol over ``--remote-debugging-pipe`` (JSON messages
ending in a NUL byte on file descriptors 3 and 4), so nothing beyond the standard library is needed:
no websocket client, no Selenium/Playwright. What it records:

* console errors: ``console.error``/``console.assert`` calls (Runtime.consoleAPICalled), uncaught
  exceptions (Runtime.exceptionThrown) and the browser's own error entries (Log.entryAdded, e.g. a
  resource that failed to load);
* every request the page made (Network.requestWillBeSent) other than the page itself and ``data:``
  URLs; the browser also runs with a proxy on a dead port so a stray request fails at once instead
  of reaching the network;
* the page's height and width at a fixed viewport, every image's natural and shown size, and
  whatever ``extra`` JavaScript expression the caller evaluates (JSON-serialisable).

``browser()`` is None where Chromium is absent (Debian: ``apt install chromium``); tests skip then.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "headless_shell", "google-chrome")
VIEWPORT = (1400, 1000)


def browser() -> str | None:
    return next((shutil.which(b) for b in CANDIDATES if shutil.which(b)), None)


@dataclass
class PageCheck:
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    height: int = 0
    width: int = 0
    images: list[dict] = field(default_factory=list)
    extra: object = None

    def problems(self, max_height: int) -> list[str]:
        """What is wrong with the page, in words (empty when nothing is)."""
        out = [f"console: {e}" for e in self.console_errors]
        out += [f"network request: {u}" for u in self.requests]
        if self.height > max_height:
            out.append(f"page is {self.height} px tall (bound {max_height})")
        if self.width > VIEWPORT[0]:
            out.append(f"page is {self.width} px wide: it scrolls sideways at {VIEWPORT[0]} px")
        out += [f"image {i['alt']!r} did not load" for i in self.images if not i["w"]]
        return out


class _Pipe:
    """A DevTools session over the browser's pipe: commands in order, events kept."""

    def __init__(self, exe: str, profile: str):
        to_r, self._to = os.pipe()  # we write commands, the browser reads fd 3
        self._from, from_w = os.pipe()  # the browser writes fd 4, we read

        def fds():  # in the child: fd 3 and 4, inheritable (copies first: the pipes may already be 3 or 4)
            r, w = os.dup(to_r), os.dup(from_w)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             f"--user-data-dir={profile}", "--no-first-run", "--no-default-browser-check",
             "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>", "--disable-background-networking",
             "--disable-component-update", "--disable-extensions", "--mute-audio", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=fds, close_fds=False)
        os.close(to_r)
        os.close(from_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from], [], [], left)[0]:
                raise TimeoutError("no answer from Chromium")
            chunk = os.read(self._from, 1 << 16)
            if not chunk:
                raise RuntimeError(f"Chromium closed the pipe (exit {self.proc.poll()})")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout=30.0) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_for(self, method: str, timeout=30.0) -> dict:
        deadline = time.monotonic() + timeout
        for m in self.events:
            if m.get("method") == method:
                return m
        while True:
            m = self._read(deadline)
            self.events.append(m)
            if m.get("method") == method:
                return m

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except Exception:  # noqa: BLE001 - it may be gone already
            pass
        for fd in (self._to, self._from):
            os.close(fd)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _text(args: list[dict]) -> str:
    return " ".join(str(a.get("value", a.get("description", a.get("type")))) for a in args)


def check_page(page: Path, extra: str | None = None, *, settle_s: float = 0.3) -> PageCheck:
    """Load ``page`` (a local file) at a 1400x1000 viewport and return what was seen."""
    exe = browser()
    if exe is None:
        raise RuntimeError("no Chromium")
    url = Path(page).resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="pb-chromium-") as profile:
        cdp = _Pipe(exe, profile)
        try:
            target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            s = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                cdp.send(f"{domain}.enable", session=s)
            w, h = VIEWPORT
            cdp.send("Emulation.setDeviceMetricsOverride",
                     {"width": w, "height": h, "deviceScaleFactor": 1, "mobile": False}, session=s)
            cdp.events.clear()
            cdp.send("Page.navigate", {"url": url}, session=s)
            cdp.wait_for("Page.loadEventFired", timeout=60)
            time.sleep(settle_s)  # late timers and their errors

            def js(expr: str):
                r = cdp.send("Runtime.evaluate", {"expression": expr, "returnByValue": True}, session=s)
                if "exceptionDetails" in r:
                    raise RuntimeError(f"{expr[:60]}: {r['exceptionDetails']}")
                return r["result"].get("value")

            out = PageCheck(
                height=js("document.documentElement.scrollHeight"),
                width=js("document.documentElement.scrollWidth"),
                images=js("Array.from(document.images).map(i => ({alt: i.alt, w: i.naturalWidth, "
                          "h: i.naturalHeight, shown: i.getBoundingClientRect().width}))"),
                extra=js(extra) if extra else None)
        finally:
            cdp.close()
    for m in cdp.events:
        p, method = m.get("params", {}), m.get("method")
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.console_errors.append(f"console.{p['type']}: {_text(p.get('args', []))}")
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.console_errors.append(f"uncaught: {d.get('exception', {}).get('description') or d.get('text')}")
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            e = p["entry"]
            out.console_errors.append(f"{e.get('source')}: {e.get('text')} {e.get('url', '')}".strip())
        elif method == "Network.requestWillBeSent":
            u = p.get("request", {}).get("url", "")
            if u != url and not u.startswith("data:"):
                out.requests.append(u)
    return out
