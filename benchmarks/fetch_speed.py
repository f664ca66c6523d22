"""How fast a run file comes back over a real loopback sshd: the archive's streamed fetch
(`Session.download_to`, a piece of at most 1 MiB held at once, issue 80) beside paramiko's
whole-file `getfo` into memory (how a fetch read a file before). Prints MiB/s, the median
of `--repeat` fetches of each, for a file of random data and one mostly holes.

    python benchmarks/fetch_speed.py --mib 64 --repeat 3
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _fleet import BenchFleet

from gpufleet.archive.incoming import Incoming
from gpufleet.control.connect.pool import open_session
from gpufleet.control.inventory.model import load_inventory


def _file(folder: Path, name: str, mib: int, sparse: bool) -> Path:
    path = folder / name
    with open(path, "wb") as fh:
        if sparse:  # 1 MiB of data at each end, holes between
            fh.write(os.urandom(1 << 20))
            fh.seek((mib - 2) << 20, os.SEEK_CUR)
            fh.write(os.urandom(1 << 20))
        else:
            for _ in range(mib):
                fh.write(os.urandom(1 << 20))
    return path


def _streamed(session, path: Path, dest: Path) -> float:
    size = path.stat().st_size
    began = time.perf_counter()
    with open(dest, "wb") as fh:
        incoming = Incoming(fh, size)
        got = session.download_to(str(path), incoming, size)
        incoming.finish()
    took = time.perf_counter() - began
    if got != size:
        raise SystemExit(f"fetch_speed: {path.name}: {got} of {size} bytes came")
    return took


def _whole(session, path: Path) -> float:
    began = time.perf_counter()
    buffer = io.BytesIO()
    session.conn.sftp().getfo(str(path), buffer)
    took = time.perf_counter() - began
    if buffer.tell() != path.stat().st_size:
        raise SystemExit(f"fetch_speed: {path.name}: getfo brought {buffer.tell()} bytes")
    return took


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    fleet = BenchFleet(1)
    folder = Path(tempfile.mkdtemp(prefix="gpufleet-fetch-speed-", dir="/tmp"))
    try:
        [host] = load_inventory(fleet.inventory).select("all")
        session = open_session(host)
        try:
            for name, sparse in (("random", False), ("sparse", True)):
                path = _file(folder, f"{name}.bin", args.mib, sparse)
                streamed = [_streamed(session, path, folder / "got") for _ in range(args.repeat)]
                whole = [_whole(session, path) for _ in range(args.repeat)]
                disk = (folder / "got").stat().st_blocks * 512 >> 20
                print(f"{name} {args.mib} MiB over loopback sshd: streamed "
                      f"{args.mib / statistics.median(streamed):.0f} MiB/s "
                      f"({disk} MiB on disk), whole-file getfo "
                      f"{args.mib / statistics.median(whole):.0f} MiB/s "
                      f"(median of {args.repeat})")  # fmt: skip
        finally:
            session.close()
    finally:
        fleet.close()
        for child in folder.iterdir():
            child.unlink()
        folder.rmdir()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
