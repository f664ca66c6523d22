"""Open a page from disk in real headless Chromium (Debian's `chromium`) over the DevTools
protocol: console errors, every network request, load time, DOM facts and a screenshot."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from gpufleet.sim.sshd import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FACTS_JS = """JSON.stringify({
  tables: [...document.querySelectorAll('table')].map(t => t.innerText),
  plots: [...document.querySelectorAll('svg.plot')].map(s => s.getAttribute('aria-label')),
  points: [...document.querySelectorAll('svg.plot title')].map(t => t.textContent),
  text: document.body.innerText,
  links: [...document.querySelectorAll('a')].map(a => a.getAttribute('href')),
  data: JSON.parse(document.getElementById('gpufleet-data').textContent),
  pageWidth: document.documentElement.scrollWidth,
})"""
# The smallest text a reader sees, in CSS pixels: every element that holds text directly,
# HTML by its computed font size, SVG <text> by its font size times the SVG's scale on the
# screen. Hidden elements (closed <details>, display: none) are left out.
TEXT_SIZES_JS = """JSON.stringify((() => {
  const out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const el = node.parentElement;
    if (!el || !node.textContent.trim() || el.closest('script,style,title')) continue;
    const box = el.getBoundingClientRect();
    if (box.width === 0 && box.height === 0) continue;
    let size = parseFloat(getComputedStyle(el).fontSize);
    if (el instanceof SVGElement) {
      const m = el.getScreenCTM();
      size *= Math.sqrt(Math.abs(m.a * m.d - m.b * m.c));
    }
    out.push([Math.round(size * 100) / 100, node.textContent.trim().slice(0, 40)]);
  }
  out.sort((a, b) => a[0] - b[0]);
  return out;
})())"""


# What fits: the page's width against the viewport, every plot's legend and title box
# against its figure (more than a pixel outside is clipped), and how far down the first
# warning or error and the first plot begin.
FIT_JS = r"""JSON.stringify((() => {
  const top = el => el ? el.getBoundingClientRect().top + scrollY : null;
  const clipped = [];
  for (const svg of document.querySelectorAll('svg.plot')) {
    const box = svg.getBoundingClientRect();
    for (const part of svg.querySelectorAll('#gpufleet-legend, #gpufleet-title')) {
      const r = part.getBoundingClientRect();
      if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 ||
          r.bottom > box.bottom + 1) clipped.push(svg.getAttribute('aria-label') + ': ' + part.id);
    }
  }
  // a word or number of any table cell, headers included, split over two lines (closed
  // <details> left out); and a data cell of the verdict or open-loop table on two lines
  const lines = range => new Set([...range.getClientRects()].filter(r => r.width > 0)
                                 .map(r => Math.round(r.top))).size;
  const broken = [];
  for (const cell of document.querySelectorAll('table th, table td')) {
    if (cell.closest('details:not([open])')) continue;
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.textContent.matchAll(/\S+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        if (lines(range) > 1) broken.push(m[0]);
      }
    }
  }
  for (const td of document.querySelectorAll('table.verdict td, table.open td')) {
    const range = document.createRange();
    range.selectNodeContents(td);
    if (lines(range) > 1) broken.push(td.innerText);
  }
  const scrolls = [...document.querySelectorAll('div.scroll')].map(s => {
    const h = s.previousElementSibling;
    return {wider: s.scrollWidth > s.clientWidth + 1, width: s.scrollWidth, box: s.clientWidth,
            hint: !!(h && h.classList.contains('hint') && !h.hidden)};
  });
  return {viewport: innerWidth, page: document.documentElement.scrollWidth, clipped, broken,
          scrolls,
          parts: document.querySelectorAll('svg.plot #gpufleet-legend').length,
          warning: top(document.querySelector('ul.warn, ul.errors')),
          warnings: document.querySelectorAll('ul.warn li').length,
          table: top(document.querySelector('table.verdict')),
          plot: top(document.querySelector('svg.plot'))};
})())"""


@dataclass
class PageVisit:
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, log errors
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    load_s: float = 0.0
    facts: dict[str, Any] = field(default_factory=dict)
    screenshot: bytes = b""
    phone_width: int = 0  # the page's scroll width in a 390 px viewport
    text_px: dict[int, list[tuple[float, str]]] = field(default_factory=dict)  # width -> sizes
    phone_screenshot: bytes = b""
    fit: dict[int, dict[str, Any]] = field(default_factory=dict)  # width -> FIT_JS


class _Devtools:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse, visit: PageVisit) -> None:
        self.ws = ws
        self.visit = visit
        self.next_id = 0
        self.events: list[str] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        await self.ws.send_json({"id": self.next_id, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json(timeout=30)
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]
            self._event(msg)

    async def wait_for(self, event: str) -> None:
        while event not in self.events:
            self._event(await self.ws.receive_json(timeout=30))

    def _event(self, msg: dict[str, Any]) -> None:
        method, params = msg.get("method", ""), msg.get("params", {})
        self.events.append(method)
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.visit.errors.append(json.dumps(params.get("args"))[:300])
        elif method == "Runtime.exceptionThrown":
            self.visit.errors.append(json.dumps(params.get("exceptionDetails"))[:300])
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.visit.errors.append(params["entry"].get("text", "")[:300])
        elif method == "Network.requestWillBeSent":
            self.visit.requests.append(params["request"]["url"])


STARTUP_S = 30.0  # chromium's DevTools port, on a busy 2-core machine: seen past 10 s


async def _devtools_up(http: aiohttp.ClientSession, base: str, proc: subprocess.Popen) -> bool:
    """Wait until chromium answers on its DevTools port; False if it exits or never does
    (another process took the port between free_port() and chromium's bind, say)."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            async with http.get(f"{base}/json/version") as r:
                if r.status == 200:
                    return True
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    return False


async def _visit(page: Path, width: int, height: int, attempts: int = 3) -> PageVisit:
    """One visit; chromium is started again on a fresh port if it never opened its own."""
    for attempt in range(attempts):
        try:
            return await _visit_once(page, width, height)
        except _NoDevtools:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


class _NoDevtools(Exception):
    """chromium did not open its DevTools port in time."""


async def _visit_once(page: Path, width: int, height: int) -> PageVisit:
    port = free_port()
    visit = PageVisit()
    # chromium's helpers may still be writing their profile as it exits: ignore that
    with tempfile.TemporaryDirectory(
        prefix="gpufleet-chromium-", ignore_cleanup_errors=True
    ) as profile:
        proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                f"--remote-debugging-port={port}",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its renderer and GPU helpers go with it
        )
        try:
            async with aiohttp.ClientSession() as http:
                base = f"http://127.0.0.1:{port}"
                if not await _devtools_up(http, base, proc):
                    raise _NoDevtools(f"chromium did not open port {port} in {STARTUP_S:g} s")
                async with http.put(f"{base}/json/new?about:blank") as r:
                    target = await r.json()
                ws = await http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
                tools = _Devtools(ws, visit)
                for domain in ("Runtime", "Log", "Network", "Page"):
                    await tools.call(f"{domain}.enable")
                await tools.call(
                    "Emulation.setDeviceMetricsOverride",
                    width=width, height=height, deviceScaleFactor=1, mobile=False,
                )  # fmt: skip
                started = time.perf_counter()
                await tools.call("Page.navigate", url=page.resolve().as_uri())
                await tools.wait_for("Page.loadEventFired")
                visit.load_s = time.perf_counter() - started
                result = await tools.call("Runtime.evaluate", expression=FACTS_JS)
                visit.facts = json.loads(result["result"]["value"])
                shot = await tools.call("Page.captureScreenshot", format="png")
                visit.screenshot = base64.b64decode(shot["data"])
                result = await tools.call("Runtime.evaluate", expression=TEXT_SIZES_JS)
                visit.text_px[width] = [tuple(x) for x in json.loads(result["result"]["value"])]
                result = await tools.call("Runtime.evaluate", expression=FIT_JS)
                visit.fit[width] = json.loads(result["result"]["value"])
                await tools.call(
                    "Emulation.setDeviceMetricsOverride",
                    width=390, height=844, deviceScaleFactor=1, mobile=True,
                )  # fmt: skip
                result = await tools.call(
                    "Runtime.evaluate", expression="document.documentElement.scrollWidth"
                )
                visit.phone_width = int(result["result"]["value"])
                result = await tools.call("Runtime.evaluate", expression=TEXT_SIZES_JS)
                visit.text_px[390] = [tuple(x) for x in json.loads(result["result"]["value"])]
                result = await tools.call("Runtime.evaluate", expression=FIT_JS)
                visit.fit[390] = json.loads(result["result"]["value"])
                shot = await tools.call("Page.captureScreenshot", format="png")
                visit.phone_screenshot = base64.b64decode(shot["data"])
                await ws.close()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return visit


def visit(page: Path, width: int = 1280, height: int = 800) -> PageVisit:
    return asyncio.run(_visit(page, width, height))
