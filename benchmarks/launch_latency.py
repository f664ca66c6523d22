"""inv launch latencies over real sshd with the rehearsal engine.

- ready-detection lag: /health first answers 200 (probed every 5 ms from here) -> gpufleet
  reports ready (goal <= 0.5 s);
- crash-detection lag: the server process dies -> gpufleet reports it with the log tail
  (goal <= 2 s);
- launch overhead: launch wall time minus the server's own time from process start to first
  200 (goal <= 1.5 s per host), for 1 host and 8 hosts in parallel.

    python benchmarks/launch_latency.py
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from datetime import datetime
from pathlib import Path

import yaml
from _fleet import BenchFleet

from gpufleet.control.connect.fleet import Fleet
from gpufleet.control.inventory.model import load_inventory
from gpufleet.control.server import lifecycle as server
from gpufleet.control.server.profiles import load_profile
from gpufleet.host.agent.protocol import StopArgs
from gpufleet.host.server import probe as healthprobe
from gpufleet.sim.sshd import free_port


def first_200(url: str, stop: threading.Event, out: dict) -> None:
    while not stop.is_set():
        if healthprobe.is_ready(url, timeout=1):
            out["t"] = time.time()
            return
        time.sleep(0.005)


def profile(root: Path, name: str, **fields) -> str:
    data = {
        "engine": "sim",
        "model_path": "/m",
        "tp": 1,
        "port": free_port(),
        "health_timeout": 60,
        "sim": {"load-seconds": 2, "warmup-seconds": 0.3},
        **fields,
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def launch_round(fleet: BenchFleet, n: int) -> tuple[list[float], list[float]]:
    inv = load_inventory(fleet.inventory)
    hosts = inv.select(None)[:n]
    for i, h in enumerate(hosts):
        h.vars["server_port_offset"] = i
    prof = load_profile(profile(fleet.root, f"p{n}"))
    probes, stops, threads = [], [], []
    for i in range(n):
        out: dict = {}
        stop = threading.Event()
        t = threading.Thread(
            target=first_200, args=(f"http://127.0.0.1:{prof.port + i}/health", stop, out)
        )
        t.start()
        probes.append(out)
        stops.append(stop)
        threads.append(t)
    reported: dict[str, float] = {}

    def progress(host: str, event: dict) -> None:
        if event.get("phase") == "ready":
            reported[host] = time.time()

    start = time.time()
    results = server.launch(Fleet(hosts, 32), prof, server.LaunchOptions(), progress=progress)
    end = time.time()
    for s in stops:
        s.set()
    for t in threads:
        t.join()
    lags, overheads = [], []
    for i, res in enumerate(results):
        assert res.ok, res.error
        st = res.value["state"]
        started = datetime.fromisoformat(st["started_at"].replace("Z", "+00:00")).timestamp()
        lags.append(reported[res.host.name] - probes[i]["t"])
        overheads.append((end - start) - (probes[i]["t"] - started))
    server.stop(Fleet(hosts, 32), StopArgs(grace_s=5, timeout_s=30))
    return lags, overheads


def crash_lag(fleet: BenchFleet) -> float:
    inv = load_inventory(fleet.inventory)
    host = inv.select(None)[0]
    marker = fleet.root / "died_at"
    script = (
        f"import time, sys; time.sleep(2); open('{marker}', 'w').write(repr(time.time())); "
        "sys.exit(3)"
    )
    prof = load_profile(
        profile(
            fleet.root,
            "crash",
            engine="custom",
            check_model_path=False,
            command=["{python}", "-c", script],
            sim={},
        )
    )
    [res] = server.launch(Fleet([host], 1), prof, server.LaunchOptions())
    reported = time.time()
    assert not res.ok and res.tail is not None
    return reported - float(marker.read_text())


def main() -> None:
    fleet = BenchFleet(hosts=8, sshds=1, max_startups="100:30:200")
    try:
        everyone = Fleet(load_inventory(fleet.inventory).select(None), 32)
        server.launch(
            everyone,
            load_profile(profile(fleet.root, "warm", sim={"load-seconds": 0.1})),
            server.LaunchOptions(),
        )
        server.stop(everyone, StopArgs(grace_s=5, timeout_s=30))
        for n in (1, 8):
            lags, overheads = launch_round(fleet, n)
            print(
                f"{n} host(s): ready-detection lag median {statistics.median(lags):.3f}s "
                f"max {max(lags):.3f}s; launch overhead median {statistics.median(overheads):.2f}s "
                f"max {max(overheads):.2f}s"
            )
        lags = [crash_lag(fleet) for _ in range(3)]
        print(
            f"crash-detection lag: median {statistics.median(lags):.3f}s max {max(lags):.3f}s "
            "(process exit -> failure reported with log tail)"
        )
    finally:
        fleet.close()
    print(json.dumps({"note": "2-core machine; all hosts share it"}))


if __name__ == "__main__":
    main()
