"""A file coming into the archive from elsewhere (a host's run, a local run), written as it
arrives: in pieces, counted against a limit, hashed on the way, its holes kept.

Nothing of it is held whole: a piece is written (or skipped) and dropped, so the memory a
fetch takes is a piece's, whatever the file's size. The count is of the bytes received,
never of what a host said the file holds (a host is not trusted): a piece that takes the
count past the limit raises OverLimit before it is written.

Holes are kept: every aligned block of zeros received is skipped instead of written, so
a sparse file (a runner's `ftruncate`) takes the archive's disk its data takes, not its
apparent size, and reads back the same bytes (its sha256 is of the bytes received). The
zeros still cross the connection and still count against the bounds: a hole costs the
fetch its apparent size in transfer, bounded there, and nothing in memory or on disk.
"""

from __future__ import annotations

import hashlib
import os
from typing import BinaryIO

BLOCK = 64 << 10  # the granularity of a kept hole
_ZEROS = bytes(BLOCK)


class OverLimit(Exception):
    """A file that went past its limit while it was received (nothing of it is kept)."""

    def __init__(self, received: int, limit: int) -> None:
        super().__init__(f"{received} bytes received, over the {limit} allowed")
        self.received = received
        self.limit = limit


class Incoming:
    """One file being received into `fh` (fresh, empty, seekable): `write` its pieces in
    order, then `finish` for its sha256."""

    def __init__(self, fh: BinaryIO, limit: int) -> None:
        self.fh = fh
        self.limit = limit
        self.size = 0  # bytes received
        self.written = 0  # of them, written as data (the rest are holes)
        self._digest = hashlib.sha256()

    def write(self, piece: bytes) -> int:
        """Take the next piece; OverLimit once the bytes received pass the limit."""
        if self.size + len(piece) > self.limit:
            raise OverLimit(self.size + len(piece), self.limit)
        self._digest.update(piece)
        view, at = memoryview(piece), 0
        while at < len(view):
            end = min(len(view), at + BLOCK - (self.size + at) % BLOCK)  # aligned blocks
            block = view[at:end]
            if block == _ZEROS[: len(block)]:
                self.fh.seek(len(block), os.SEEK_CUR)  # a hole: read back as zeros
            else:
                self.fh.write(block)
                self.written += len(block)
            at = end
        self.size += len(piece)
        return len(piece)

    def finish(self) -> str:
        """The file as received, on disk (a trailing hole included): its sha256."""
        self.fh.truncate(self.size)
        self.fh.flush()
        os.fsync(self.fh.fileno())
        return self._digest.hexdigest()
