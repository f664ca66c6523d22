"""One HTTP GET against a server that may not be listening yet, without ever talking to itself.

Polling a loopback port nobody listens on can end in a TCP self-connect: Linux may pick the
destination port as the source port, the connect "succeeds", and the client reads its own
request back (`BadStatusLine: GET /health HTTP/1.1`). Worse, for that instant the client owns
the port the server is about to bind. Whenever the port lies in the ephemeral range (any
`free_port()`, or a user's `port: 40000`), that is a real, if rare, failure. So the client
socket is bound first and rebound until its source port differs from the destination port.
"""

from __future__ import annotations

import http.client
import socket
import urllib.parse

from gpufleet.host.agent import bounded

LOADING, STARTING, READY = "loading", "starting", "ready"


class _NoSelfConnect(http.client.HTTPConnection):
    """HTTPConnection whose source port is never the destination port."""

    def connect(self) -> None:
        self.sock = connect_no_self(self.host, self.port, self.timeout)


def connect_no_self(host: str, port: int, timeout: float | None) -> socket.socket:
    last: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        for _attempt in range(8):
            sock = socket.socket(family, kind, proto)
            try:
                sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
                if sock.getsockname()[1] == port:
                    sock.close()
                    continue
                sock.settimeout(timeout)
                sock.connect(address)
                return sock
            except OSError as exc:
                sock.close()
                last = exc
                break
    raise last or ConnectionRefusedError(f"cannot connect to {host}:{port}")


BODY_LIMIT = 64 << 10  # bytes of an answer the agent reads (a run_as server's body is its own)


def get(url: str, timeout: float) -> tuple[int, bytes]:
    """GET `url`: (status, body). Raises OSError when unreachable, http.client errors on garbage."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"health probes speak plain http, not {parts.scheme!r} ({url})")
    conn = _NoSelfConnect(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    try:
        conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
        resp = conn.getresponse()
        return resp.status, bounded.take(resp, BODY_LIMIT)  # a server's answer: never all
    finally:
        conn.close()


def probe(url: str, timeout: float = 5.0) -> str:
    """The server's phase as its health endpoint shows it: loading, starting, ready, or why not."""
    try:
        status, _ = get(url, timeout)
    except TimeoutError:
        return STARTING  # busy warming up: SGLang's /health runs a generation
    except (ConnectionRefusedError, ConnectionResetError, ConnectionAbortedError):
        return LOADING
    except http.client.HTTPException:
        return LOADING  # half-open listener or a non-HTTP answer: not our server yet
    except OSError as exc:
        return f"unreachable ({exc.strerror or exc})"
    if status == 200:
        return READY
    return STARTING if status == 503 else f"http {status}"


def is_ready(url: str, timeout: float = 2.0) -> bool:
    return probe(url, timeout) == READY
