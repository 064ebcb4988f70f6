"""A page as a real browser shows it: Debian's headless Chromium driven over the DevTools protocol on a pipe
(--remote-debugging-pipe: JSON messages ended by NUL on descriptors 3 and 4; no websocket, no port).

``load`` opens one file and returns every request the page made (its own file:// document included), every console
message, exception and browser log entry of level error, what a JavaScript expression evaluates to in the loaded
page, and a full-page screenshot.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium")


@dataclass
class Loaded:
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    value: Any = None
    screenshot: bytes = b""


class _Pipe:
    def __init__(self, write_fd: int, read_fd: int):
        self.w, self.r, self.buffer, self.next_id, self.events = write_fd, read_fd, b"", 0, []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.w, json.dumps(message).encode() + b"\0")
        while True:
            reply = self.receive()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def receive(self) -> dict:
        while b"\0" not in self.buffer:
            data = os.read(self.r, 1 << 20)
            if not data:
                raise RuntimeError("chromium closed its DevTools pipe")
            self.buffer += data
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events:
                if event.get("method") == method:
                    return event
            self.events.append(self.receive())
        raise TimeoutError(method)


def _onto_3_and_4(read_end: int, write_end: int) -> None:
    """In the child: its ends of the pipes become descriptors 3 and 4, whatever numbers they had."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (read_end, write_end)]
    os.dup2(high[0], 3)
    os.dup2(high[1], 4)


def load(path: Path, expression: str, width: int = 1400, height: int = 1000, timeout: float = 60) -> Loaded:
    to_chromium, from_us = os.pipe()
    from_chromium, to_us = os.pipe()
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    # Chromium reads commands on its fd 3 and writes on its fd 4.
    process = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
         f"--user-data-dir={profile}", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "about:blank"],
        pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=lambda: _onto_3_and_4(to_chromium, to_us))
    os.close(to_chromium)
    os.close(to_us)
    pipe = _Pipe(from_us, from_chromium)
    loaded = Loaded()
    try:
        target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Network", "Runtime", "Log", "Page"):
            pipe.send(f"{domain}.enable", session=session)
        pipe.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False}, session=session)
        pipe.events.clear()
        pipe.send("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
        pipe.wait_for("Page.loadEventFired", timeout)
        loaded.value = pipe.send("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                 session=session).get("result", {}).get("value")
        shot = pipe.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                         session=session)
        loaded.screenshot = base64.b64decode(shot["data"])
        for event in pipe.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Network.requestWillBeSent":
                loaded.requests.append(params["request"]["url"])
            elif method == "Runtime.consoleAPICalled":
                loaded.errors.append(f"console.{params['type']}: "
                                     + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            elif method == "Runtime.exceptionThrown":
                loaded.errors.append(f"exception: {params['exceptionDetails'].get('text')}")
            elif method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                loaded.errors.append(f"log: {params['entry']['text']}")
        try:
            pipe.send("Browser.close")
        except RuntimeError:
            pass
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(from_us)
        os.close(from_chromium)
        shutil.rmtree(profile, ignore_errors=True)
    return loaded
