"""What the runner asks of the server besides its load: /server_info, /flush_cache and
/metrics samples, each with the server's key when it has one (host/server/keys.py).
Every body is read to a stated bound (host/agent/bounded.py): over it, nothing is kept."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

from gpufleet.host.agent import bounded
from gpufleet.host.server import keys as serverkeys
from gpufleet.host.server import listener
from gpufleet.records import ServerState
from gpufleet.wire import JsonObject

PROM_KEYS = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:gen_throughput",
    "sglang:token_usage",
    "sglang:spec_accept_length",
)


def _get_json(url: str, keys: dict[str, str]) -> object:
    request = urllib.request.Request(url, headers=serverkeys.headers(keys))
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(bounded.read(resp, bounded.HTTP_BODY, url))
    except (OSError, ValueError):  # bounded.TooLarge too: an answer over the bound is none
        return None


def server_info(
    base_url: str, keys: dict[str, str], server: ServerState | None = None
) -> JsonObject | None:  # SGLang's
    """SGLang's /server_info (the older name as a fallback), with the server's key; None
    where neither answers with a JSON object, or where the port's listener is not the
    launched `server` (host/server/listener.py: nothing is sent)."""
    if listener.refusal_for(server):
        return None
    for path in ("/server_info", "/get_server_info"):
        info = _get_json(base_url + path, keys)
        if isinstance(info, dict) and info:
            return info
    return None


def accept_length(info: JsonObject | None) -> float | None:  # SGLang's /server_info
    """SGLang's average speculative acceptance length in /server_info, if it reports one."""
    states = (info or {}).get("internal_states") or [{}]
    found = states[0].get("avg_spec_accept_length") if isinstance(states[0], dict) else None
    return float(found) if isinstance(found, int | float) else None


def tokenizer(info: JsonObject | None) -> str | None:  # SGLang's /server_info
    """The served model's tokenizer as /server_info names it (else its model path)."""
    return (info or {}).get("tokenizer_path") or (info or {}).get("model_path")


MetricSample = dict[str, float]  # one scrape: "t" (wall clock) and each gauge of PROM_KEYS


def prometheus(text: str, aliases: dict[str, str] | None = None) -> dict[str, float]:
    """The gauges results keep (PROM_KEYS), summed over labels; `aliases`: the engine's own
    names for them (the plan carries them from its adapter, control/server/engines.py)."""
    aliases = aliases or {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        name = aliases.get(name, name)
        if name in PROM_KEYS:
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
    return out


def _get_page(url: str, keys: dict[str, str], timeout: float) -> tuple[int, str] | None:
    """A page's status and text, or None where nothing answered in time."""
    request = urllib.request.Request(url, headers=serverkeys.headers(keys))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            page = bounded.read(resp, bounded.METRICS_PAGE, url)
            return resp.status, page.decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (OSError, ValueError):
        return None


async def sample_metrics(
    url: str, samples: list[MetricSample], stop: asyncio.Event, keys: dict[str, str],
    aliases: dict[str, str] | None = None,
) -> None:  # fmt: skip
    """One /metrics sample a second until `stop`, or until the server says it has none (not
    200). Read in a thread with the standard library, so the runner needs no package (it
    may run on the system's interpreter, as the run_as user: host/bench/userrun.py)."""
    while not stop.is_set():
        page = await asyncio.to_thread(_get_page, url, keys, 5.0)
        if page is not None:
            if page[0] != 200:
                return
            samples.append({"t": time.time(), **prometheus(page[1], aliases)})
        try:
            await asyncio.wait_for(stop.wait(), timeout=1.0)
        except TimeoutError:
            pass


def flush_cache(base_url: str, keys: dict[str, str]) -> bool:
    """Empty the server's prefix cache before a level (SGLang's /flush_cache: 200 when done,
    400 while requests still run), so an earlier level's prompts do not warm this one."""
    for method in ("POST", "GET"):
        request = urllib.request.Request(
            base_url + "/flush_cache", method=method, headers=serverkeys.headers(keys, admin=True)
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return resp.status == 200  # the body is never read
        except urllib.error.HTTPError as exc:
            if exc.code != 405:
                return False
        except OSError:
            return False
    return False
