"""A stand-in GPU workload for rehearsals and tests: a process that "holds" simulated memory.

    python -m gpufleet.sim.hold --gpu 0 --gpu 1 --mib 40000 [--children 2] [--orphan]
        [--title sglang::scheduler_TP0] [--ignore-sigterm] [--seconds 600]

Registers the memory in $GPUFLEET_SIM_STATE, prints `ready <pid>...` once every process
holds its memory, then sleeps until killed (or --seconds pass). `--orphan` makes the
children outlive this parent, re-parented away as stale SGLang schedulers are.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from gpufleet.sim import gpustate


def set_title(title: str) -> None:
    """Name the process as SGLang's are named; GPUFLEET_SIM_NO_TITLE=1 rehearses a host
    whose Python lacks setproctitle (the process keeps its `python -m ...` command line)."""
    if os.environ.get("GPUFLEET_SIM_NO_TITLE") == "1":
        return
    try:
        import setproctitle

        setproctitle.setproctitle(title)
    except ImportError:  # comm only (15 bytes), as a fallback
        try:
            import ctypes

            ctypes.CDLL(None).prctl(15, title.encode()[:15], 0, 0, 0)
        except (OSError, AttributeError):
            pass


def hold(gpus: list[int], mib: int, seconds: float, ignore_sigterm: bool) -> None:
    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not os.environ.get(gpustate.STATE_ENV):
        if gpus:
            raise SystemExit(f"--gpu needs ${gpustate.STATE_ENV} (a simulated host's GPU state)")
        return
    gpustate.join_host()
    for gpu in gpus:
        gpustate.register(gpu, mib)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpufleet.sim.hold", description=__doc__)
    parser.add_argument("--gpu", type=int, action="append", default=[])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--children", type=int, default=0)
    parser.add_argument("--orphan", action="store_true")
    parser.add_argument("--title")
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args(argv)

    child_pids = []
    for i in range(args.children):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            if args.orphan:
                os.setsid()
            if args.title:
                set_title(f"{args.title}-child{i}")
            hold(args.gpu, args.mib, args.seconds, args.ignore_sigterm)
            os.write(write_fd, b"x")
            os.close(write_fd)
            time.sleep(args.seconds)
            os._exit(0)
        os.close(write_fd)
        os.read(read_fd, 1)
        os.close(read_fd)
        child_pids.append(pid)

    if args.orphan:
        print("ready " + " ".join(str(p) for p in child_pids), flush=True)
        return 0  # children are re-parented away from us
    if args.title:
        set_title(args.title)
    hold(args.gpu, args.mib, args.seconds, args.ignore_sigterm)
    print("ready " + " ".join(str(p) for p in [gpustate.host_pid(), *child_pids]), flush=True)
    time.sleep(args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
