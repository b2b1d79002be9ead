"""A real headless browser for the tests: Debian's Chromium driven over the Chrome DevTools
Protocol, with aiohttp's websocket client (no WebDriver, no extra package).

Chromium starts with ``--remote-debugging-port=0`` and writes the port it chose and its
browser endpoint's path to ``DevToolsActivePort`` in its profile folder. One websocket to the
browser endpoint carries every command, ``{"id", "method", "params", "sessionId"}`` and its
answer by id, and the events. Each :class:`Tab` is a page target in a browser context of its
own (``Target.createBrowserContext``: its own cookies, as a fresh browser profile), attached
with ``flatten`` so its commands carry the session id.

What a test does with a tab is what a person does: open a URL, type into a field
(``DOM.focus`` then ``Input.insertText``), click a button (``Input.dispatchMouseEvent`` at
the middle of its box), read the page's text. No script of the test runs inside the page
except reading it (``Runtime.evaluate``). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
WAIT = 20.0  # seconds any one thing may take


def chromium_path() -> str:
    """The browser binary; skips (fails under CI) when there is none."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    message = "no Chromium: apt-get install chromium (the headless-browser tests need it)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


class Browser:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(msg.data)
            if "id" in data:
                fut = self._waiting.pop(data["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(data)
            elif "sessionId" in data:
                self._events.setdefault(data["sessionId"], asyncio.Queue()).put_nowait(data)
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(ConnectionError("the browser closed its endpoint"))

    async def send(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        n = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[n] = fut
        msg: dict[str, Any] = {"id": n, "method": method, "params": params}
        if session is not None:
            msg["sessionId"] = session
        await self._ws.send_str(json.dumps(msg))
        answer = await asyncio.wait_for(fut, WAIT)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result", {})  # type: ignore[no-any-return]

    def events(self, session: str) -> asyncio.Queue[dict[str, Any]]:
        return self._events.setdefault(session, asyncio.Queue())

    @asynccontextmanager
    async def tab(self) -> AsyncIterator[Tab]:
        """A page in a fresh browser context: no cookie of any other tab."""
        context = (await self.send("Target.createBrowserContext"))["browserContextId"]
        target = (
            await self.send("Target.createTarget", url="about:blank", browserContextId=context)
        )["targetId"]
        session = (await self.send("Target.attachToTarget", targetId=target, flatten=True))[
            "sessionId"
        ]
        tab = Tab(self, session)
        for domain in ("Page", "Network", "DOM", "Runtime"):
            await self.send(f"{domain}.enable", session)
        try:
            yield tab
        finally:
            await self.send("Target.disposeBrowserContext", browserContextId=context)

    async def close(self) -> None:
        await self._ws.close()
        self._reader.cancel()


class Tab:
    def __init__(self, browser: Browser, session: str) -> None:
        self._b = browser
        self._session = session
        self.status = 0  # the HTTP status of the last document loaded
        self.url = ""

    async def _cmd(self, method: str, **params: Any) -> dict[str, Any]:
        return await self._b.send(method, self._session, **params)

    async def _until_loaded(self, url_part: str = "") -> None:
        """Events until a document whose URL holds ``url_part`` has loaded (bounded)."""
        queue = self._b.events(self._session)
        deadline = time.monotonic() + WAIT
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no page holding {url_part!r} loaded; at {self.url}")
            event = await asyncio.wait_for(queue.get(), left)
            method, params = event.get("method"), event.get("params", {})
            if method == "Network.responseReceived" and params.get("type") == "Document":
                self.status = params["response"]["status"]
                self.url = params["response"]["url"]
            elif method == "Page.loadEventFired" and url_part in self.url:
                return

    async def open(self, url: str) -> None:
        await self._cmd("Page.navigate", url=url)
        await self._until_loaded(url.split("?")[0])

    async def _node(self, selector: str) -> int:
        root = (await self._cmd("DOM.getDocument"))["root"]["nodeId"]
        node = (await self._cmd("DOM.querySelector", nodeId=root, selector=selector))["nodeId"]
        if not node:
            raise LookupError(f"no {selector} on {self.url}")
        return node  # type: ignore[no-any-return]

    async def has(self, selector: str) -> bool:
        try:
            await self._node(selector)
        except LookupError:
            return False
        return True

    async def type(self, selector: str, text: str) -> None:
        await self._cmd("DOM.focus", nodeId=await self._node(selector))
        await self._cmd("Input.insertText", text=text)

    async def value(self, selector: str) -> str:
        return await self.evaluate(f"document.querySelector({json.dumps(selector)}).value")  # type: ignore[no-any-return]

    async def click(self, selector: str, then: str = "") -> None:
        """Click the middle of the element, then wait for a page whose URL holds ``then``."""
        quad = (await self._cmd("DOM.getBoxModel", nodeId=await self._node(selector)))["model"][
            "content"
        ]
        x, y = (quad[0] + quad[4]) / 2, (quad[1] + quad[5]) / 2
        for kind in ("mousePressed", "mouseReleased"):
            await self._cmd(
                "Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1
            )
        await self._until_loaded(then)

    async def evaluate(self, expression: str) -> Any:
        got = await self._cmd("Runtime.evaluate", expression=expression, returnByValue=True)
        return got["result"].get("value")

    async def text(self) -> str:
        return await self.evaluate("document.body.innerText")  # type: ignore[no-any-return]


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """A headless Chromium for the test, stopped after it."""
    binary = chromium_path()
    profile = Path(tempfile.mkdtemp(prefix="chromium-"))
    proc = await asyncio.create_subprocess_exec(
        *[
            binary,
            "--headless=new",
            "--no-sandbox",  # root in a container: the sandbox needs user namespaces
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + WAIT
        while not (active.exists() and len(active.read_text().splitlines()) >= 2):
            if proc.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Chromium did not start (exit {proc.returncode})")
            await asyncio.sleep(0.05)
        port, path = active.read_text().splitlines()[:2]
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(
                f"ws://127.0.0.1:{port}{path}",
                max_msg_size=0,
                timeout=aiohttp.ClientWSTimeout(ws_close=5),
            )
            browser = Browser(ws)
            try:
                yield browser
            finally:
                await browser.close()
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await asyncio.wait_for(proc.wait(), 5)
        shutil.rmtree(profile, ignore_errors=True)
