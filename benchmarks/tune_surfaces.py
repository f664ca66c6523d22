"""`inv tune` on several rehearsal surfaces side by side: the table each one chooses, how
much of the better static the tuned server keeps at every level and in each phase of the
load step and on bursts, its depth switches, and each request's acceptance at the lowest and highest
level (coding prompts against chat on the calibrated surface).

Each tune gets its own simulated host of hosts/rehearsal-4.yaml (own workdir, GPUs and
ports), so they run at once; give it a machine with cores to spare (the README's figures
come from the 16-core GPU machine; 2 cores make every level noisier).

    python benchmarks/tune_surfaces.py --depths 1,2,3 --output-len 32

A run longer than one sitting: `--root DIR --stop-after SECONDS` interrupts every tune
(Ctrl-C, as a user would) when the time is up; `--root DIR --resume` finishes them (each
tune's own `--resume`). The report gives each tune's first estimate beside its wall time.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
# name -> (the rehearsal engine's knobs, prompt set): the seeds' calibration, a drafter
# that accepts more and costs half, and one that accepts less and costs half again more
SURFACES: dict[str, tuple[dict[str, object], str]] = {
    "calibrated": ({}, "coding"),
    "calibrated-chat": ({}, "chat"),
    "accept-0.8-draft-x0.5": ({"accept-rate": "0.8", "draft-cost": 0.5}, "coding"),
    "accept-0.5-draft-x1.5": ({"accept-rate": "0.5", "draft-cost": 1.5}, "coding"),
    # issue 37's surfaces, not calibrated to anything: a weak drafter, and one that reads
    # code well and chat badly, tuned on code
    "accept-0.35": ({"accept-rate": "0.35"}, "coding"),
    "code-0.85-chat-0.3": ({"accept-rate": "chat=0.3,code=0.85"}, "coding"),
    # issue 53's: the deepest depth best at every level (by 11% and more over the next), and
    # a mid depth best at low load (depth 4 within 2% of it) giving way to none at high
    "deep-0.9-draft-x0.3": ({"accept-rate": "0.9", "draft-cost": 0.3}, "coding"),
    "deep-0.95-draft-x0.5": ({"accept-rate": "0.95", "draft-cost": 0.5}, "coding"),
    "mid-0.7-draft-x1.0": ({"accept-rate": "0.7", "draft-cost": 1.0}, "coding"),
    # issue 63's: a mid depth best at low load and the deepest from mid load (a drafter
    # bound by its launches: twice the fixed cost per draft step, a tenth per request)
    "rising-0.8-base-x2": (
        {"accept-rate": "0.8", "draft-cost": 0.1, "draft-base-cost": 2.0},
        "coding",
    ),
}
HOSTS = ("sim-a", "sim-b", "sim-c", "sim-d")
PARENTS = ("baseline", "eagle3", "eagle3-adaptive")


def write_profiles(root: Path) -> dict[str, Path]:
    """The surfaces as profiles beside copies of their parents (a profile given by path
    extends profiles in its own folder; the tuned ones are written there too)."""
    playbooks = root / "playbooks"
    playbooks.mkdir(parents=True)
    for name in PARENTS:
        shutil.copy(REPO / "playbooks" / f"{name}.yaml", playbooks / f"{name}.yaml")
    out = {}
    for name, (knobs, _prompts) in SURFACES.items():
        sim = {"load-seconds": 1.0, "warmup-seconds": 0.2, **knobs}
        path = playbooks / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"extends": "eagle3-adaptive", "sim": sim}))
        out[name] = path
    return out


def start(name: str, profile: Path, host: str, archive: Path, args: argparse.Namespace):
    command = [
        sys.executable, "-m", "gpufleet", "tune", "--profile", str(profile),
        "--inventory", str(REPO / "hosts" / "rehearsal-4.yaml"), "--hosts", host,
        "--depths", args.depths, "--concurrency", args.concurrency,
        "--output-len", str(args.output_len), "--prompts", SURFACES[name][1],
        "--repeat", str(args.repeat), "--archive", str(archive),
        *(["--resume"] if args.resume else []),
        *(["--budget", str(args.budget)] if args.budget else []),
    ]  # fmt: skip
    log = open(archive.parent / f"{name}.out", "a")  # noqa: SIM115
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO), log


def estimates(out: str) -> list[str]:
    """The tune's own time lines: its plan up front, then the estimate after each cell."""
    return [ln for ln in out.splitlines() if re.match(r"tune: (\d+ launches|\d+ cells? left)", ln)]


def acceptance(archive: Path, host: str, sweep_id: str) -> dict[int, tuple[float, ...]]:
    """The static speculation server's per-request acceptance (p10, p50, p90) by level,
    from the verification sweep's run of it."""
    state = json.loads((archive / "sweeps" / f"{sweep_id}.json").read_text())
    keys = [a["key"] for a in state["arms"] if a["label"].endswith("-static")]
    out = {}
    for key in keys:
        run_id = state["cells"][key][host].get("run_id")
        results = archive / host / str(run_id) / "results.jsonl"
        if run_id is None or not results.is_file():
            continue  # dropped by --budget, or not brought back with the records
        for line in results.read_text().splitlines():
            row = json.loads(line)
            if row.get("median_request_accept_length") is not None:
                out[row["max_concurrency"]] = tuple(
                    row[f"{q}_request_accept_length"] for q in ("p10", "median", "p90")
                )
    return out


def _objectives(archive: Path, host: str, state: dict, label: str) -> list[dict[int, float]]:
    """Each launch of one server in a sweep: level -> its objective (steady-window output
    tok/s, else the whole level's), in launch order."""
    out = []
    for arm in state["arms"]:
        if arm["label"] != label:
            continue
        run_id = state["cells"][arm["key"]].get(host, {}).get("run_id")
        results = archive / host / str(run_id) / "results.jsonl"
        if run_id is None or not results.is_file():
            continue
        rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
        out.append({r["max_concurrency"]: r.get("steady_output_throughput")
                    or r.get("output_throughput") or 0.0 for r in rows})  # fmt: skip
    return out


def launch_interval(archive: Path, host: str, sweep_id: str, tuned: str,
                    static: str, c: int) -> tuple[float, float] | None:  # fmt: skip
    """The tuned server's share of a static server at level c, launch by launch (the
    verification launches each twice, interleaved: launch k against launch k): its lowest
    and highest."""
    state = json.loads((archive / "sweeps" / f"{sweep_id}.json").read_text())
    ours, theirs = (_objectives(archive, host, state, label) for label in (tuned, static))
    shares = [a[c] / b[c] for a, b in zip(ours, theirs, strict=False)
              if c in a and c in b and b[c]]  # fmt: skip
    return (min(shares), max(shares)) if shares else None


def optimum(name: str, depths: list[int], levels: list[int]) -> dict[int, tuple[int, float]]:
    """The timing model's own answer per level: the depth with the most output tok/s (C
    requests, each accepting its depth's mean tokens a step, at that depth's step cost),
    and the next best's share of it."""
    from gpufleet.sim.speculation import accept_length, parse_accept_rates, step_costs_ms

    knobs, prompts = SURFACES[name]
    rates = parse_accept_rates(str(knobs["accept-rate"])) if "accept-rate" in knobs else {}
    rate = rates.get("code" if prompts == "coding" else "chat") or (
        0.65 if prompts == "coding" else 0.56
    )
    scale = float(knobs.get("draft-cost", 1.0))
    fixed = float(knobs["draft-base-cost"]) if "draft-base-cost" in knobs else None
    out = {}
    for c in levels:
        tput = {}
        for d in [0, *depths]:
            base, per = step_costs_ms(d, 1, None, scale, fixed)
            tput[d] = c * accept_length(d, 1, rate) / (base + per * c)
        best = max(tput, key=tput.__getitem__)
        out[c] = (best, max((v for d, v in tput.items() if d != best), default=0) / tput[best])
    return out


def report(name: str, archive: Path, host: str, wall: float, depths: list[int]) -> None:
    [path] = (archive / "tunes").glob("*.json")
    record = json.loads(path.read_text())
    print(f"\n== {name} ({SURFACES[name][1]} prompts, sim {SURFACES[name][0] or 'defaults'})")
    print(
        f"wall {wall:.0f} s, launches {record['launches']} (tune); ties measured again: "
        f"{sum('measured again' in ch['why'] for ch in record['choices'])} level(s)"
    )
    print(f"table {json.dumps(record['table'])}")
    said = estimates((archive.parent / f"{name}.out").read_text())
    if len(said) > 1:
        print(f"the tune's estimate after its first cell: {said[1]}")
    print(f"{'C':>4} {'depth':>5} {'optimum':>7} {'wins':>12} {'kept':>6} {'best static':>15} "
          f"{'kept':>6} {'per launch':>13}")  # fmt: skip
    chosen = {ch["concurrency"]: ch["depth"] for ch in record["choices"]}
    best_at = optimum(name, depths, sorted(chosen))
    verified = record["verify"].get(host)
    if verified is None:
        print("no verification (--budget dropped it): " + "; ".join(record["notes"][-2:]))
        return
    for row in verified["rows"]:
        c, best = row["concurrency"], row.get("kept_best")
        analytic = best_at.get(c)
        told = "-" if analytic is None else f"{analytic[0]} ({analytic[1]:.2f})"
        tuned_label = Path(record["tuned_profile"]).stem
        static = row.get("best_static")
        span = static and launch_interval(archive, host, verified["sweep_id"], tuned_label,
                                          static, c)  # fmt: skip
        told_span = f"{span[0]:.3f}-{span[1]:.3f}" if span else "-"
        print(f"{c:>4} {chosen.get(c, '-'):>5} {told:>7} {row['winner']:>12} {row['kept']:>6.1%} "
              f"{static or '-':>15} "
              f"{'-' if best is None else f'{best:.1%}':>6} {told_span:>13}")  # fmt: skip
    for said in verified.get("mend", []):
        print(f"mend: {said}")
    for short in verified.get("shortfalls", []):
        print(f"below the 0.98 goal: {short}")
    print(verified["sentence"])
    for said in record["step"].get(host, {}).get("headline", []):
        print(f"headline: {said}")
    for note in record["notes"]:
        print(f"note: {note}")
    for phase in record["step"].get(host, {}).get("phases", []):
        print(
            f"step {phase['phase']:<9} C={phase['concurrency']:<3} {phase['winner']:>12} "
            f"kept {phase['kept']:.1%}, depth switches {phase['switches']}"
        )
    for c, (p10, p50, p90) in sorted(acceptance(archive, host, verified["sweep_id"]).items()):
        print(f"static speculation C={c}: per-request accept p50 {p50:.2f}, p10-p90 "
              f"{p10:.2f}-{p90:.2f} tokens a step")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depths", default="1,2,3")
    p.add_argument("--concurrency", default="1,2,4,8,16,32,64")
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--budget", type=float, help="each tune's --budget, seconds")
    p.add_argument("--only", help="comma-separated surface names (default: all)")
    p.add_argument("--root", type=Path, help="where the outputs go (default: a new temp dir)")
    p.add_argument("--resume", action="store_true", help="finish the tunes under --root")
    p.add_argument("--stop-after", type=float, help="Ctrl-C every tune after this many s")
    args = p.parse_args()
    names = args.only.split(",") if args.only else list(SURFACES)
    root = args.root or Path(tempfile.mkdtemp(prefix="tune-surfaces-"))
    root = root.resolve()
    profiles = {n: root / "playbooks" / f"{n}.yaml" for n in SURFACES}
    if not args.resume:
        profiles = write_profiles(root)
    running = {}
    began = time.monotonic()
    for name, host in zip(names, HOSTS, strict=False):
        archive = root / name / "logs"
        archive.mkdir(parents=True, exist_ok=True)
        running[name] = (*start(name, profiles[name], host, archive, args), host, archive)
    if args.stop_after and _stopped(running, args.stop_after):
        print(f"stopped after {args.stop_after:.0f} s; finish with --root {root} --resume")
        return 3
    failed = 0
    for name, (proc, log, host, archive) in running.items():
        code = proc.wait()
        log.close()
        wall = time.monotonic() - began
        if code != 0:
            failed += 1
            print(f"\n== {name}: inv tune exited {code}; its output:")
            print((archive.parent / f"{name}.out").read_text()[-3000:])
            continue
        try:
            report(name, archive, host, wall, [int(d) for d in args.depths.split(",")])
        except (OSError, KeyError, ValueError) as exc:  # one surface's report, not the others'
            failed += 1
            print(f"\n== {name}: its report failed: {exc!r}")
    print(f"\noutputs under {root}")
    return 1 if failed else 0


def _stopped(running: dict, after: float) -> bool:
    """Ctrl-C (SIGINT) every tune still running `after` seconds from now, as a user would;
    True if any was."""
    deadline = time.monotonic() + after
    while time.monotonic() < deadline:
        if all(proc.poll() is not None for proc, *_ in running.values()):
            return False
        time.sleep(1)
    stopped = False
    for proc, *_ in running.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            stopped = True
    for proc, log, *_ in running.values():
        proc.wait()
        log.close()
    return stopped


if __name__ == "__main__":
    raise SystemExit(main())
