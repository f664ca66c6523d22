"""The loopback port blocks the rehearsal and the tests bind (gpufleet.sim.sshd.free_port):
a profile's port is the start of a block its hosts' servers bind at their offsets, so a
port handed out later (an sshd's, another profile's) must never fall inside an earlier
block, and a block must not hold a port something already listens on."""

from __future__ import annotations

import itertools
import os
import socket

from gpufleet.sim import sshd


def _narrow_slice(monkeypatch) -> None:
    """A slice of this worker's own slice, about ten blocks wide, so collisions are likely
    (whatever the number of workers)."""
    index, count = sshd._port_slice()
    lo, _ = sshd._ephemeral_range()
    width = (lo - 1000 - max(1024, lo - 12000)) // count
    parts = max(1, width // (10 * (sshd.OFFSET_ROOM + 1)))
    monkeypatch.setenv(sshd.PORT_SLICE_ENV, f"{index * parts + parts // 2}/{count * parts}")


def test_blocks_handed_out_never_overlap_nor_cover_a_listening_port(monkeypatch):
    _narrow_slice(monkeypatch)
    sshd.release_ports()
    for _ in range(30):
        first = sshd.free_port()
        listener = socket.socket()  # a server left by an earlier test, inside the slice
        listener.bind(("127.0.0.1", first + 40))
        listener.listen()
        try:
            sshd.release_ports()  # the earlier test ended; its server did not
            blocks = [sshd.free_port() for _ in range(3)]
        finally:
            listener.close()
            sshd.release_ports()
        lo, _ = sshd._ephemeral_range()
        for port in blocks:
            assert port + sshd.OFFSET_ROOM < lo, port  # never an ephemeral port
            assert not port <= first + 40 <= port + sshd.OFFSET_ROOM, (port, first)
        blocks.sort()
        assert all(b - a > sshd.OFFSET_ROOM for a, b in itertools.pairwise(blocks)), blocks


def test_the_slice_comes_from_the_environment_and_a_bad_one_means_the_whole_range(
    monkeypatch,
):
    monkeypatch.setenv(sshd.PORT_SLICE_ENV, "2/5")
    assert sshd._port_slice() == (2, 5)
    for bad in ("5/5", "x/2", "", "3"):
        monkeypatch.setenv(sshd.PORT_SLICE_ENV, bad)
        assert sshd._port_slice() == (0, 1)
    assert os.environ[sshd.PORT_SLICE_ENV] == "3"
