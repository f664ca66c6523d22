"""Health polling never talks to itself (the TCP self-connect that once failed a CI launch).

The failure needs Linux to pick the destination port as the source port, about 1 in 28,000
connects on this machine's ephemeral range. In a private network namespace whose ephemeral
range is that single port, it happens on every connect, so the test is deterministic.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import http.client, http.server, socket, subprocess, threading
    from gpufleet.host.server import probe as healthprobe

    P, Q = 40007, 40011
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    def port_range(lo, hi):
        with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as fh:
            fh.write(f"{lo} {hi}")

    def bindable(port):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return "bindable"
        except OSError as exc:
            return exc.strerror
        finally:
            s.close()

    port_range(Q, Q)
    naive = http.client.HTTPConnection("127.0.0.1", Q, timeout=2)
    try:
        naive.request("GET", "/health")
        print("naive:", naive.getresponse().status)
    except http.client.BadStatusLine as exc:
        print("naive: read its own request back:", str(exc).strip())
    finally:
        naive.close()
    print("port after naive:", bindable(Q))

    port_range(P, P)
    print("probe while nothing listens:", healthprobe.probe(f"http://127.0.0.1:{P}/health"))
    print("port after probe:", bindable(P))

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
        def log_message(self, *a):
            pass

    port_range(P, P + 1)
    srv = http.server.HTTPServer(("127.0.0.1", P), Health)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    print("probe once the server listens:", healthprobe.probe(f"http://127.0.0.1:{P}/health"))
    srv.shutdown()
    """
)


def _netns_available() -> bool:
    if not shutil.which("unshare") or not shutil.which("ip"):
        return False
    r = subprocess.run(["unshare", "-n", "true"], capture_output=True)
    return r.returncode == 0


@pytest.mark.skipif(not _netns_available(), reason="needs `unshare -n` (root) and iproute2")
def test_probe_never_self_connects_on_a_closed_loopback_port():
    r = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # the hazard is real: a plain client connects to itself and reads its own request back
    assert lines[0] == "naive: read its own request back: GET /health HTTP/1.1", r.stdout
    # ... and keeps the port the server is about to bind
    assert lines[1] == "port after naive: Address already in use", r.stdout
    assert lines[2] == "probe while nothing listens: loading", r.stdout
    assert lines[3] == "port after probe: bindable", r.stdout
    assert lines[4] == "probe once the server listens: ready", r.stdout
