"""A server's secret flags (`--api-key`, `--admin-api-key`, ...): kept out of `ps`, and
sent by gpufleet's own requests to that server.

SGLang takes its keys only as flags, and every local user can read a process's command
line. From 0.5.16 `launch_server --config FILE.yaml` merges a YAML mapping of option names
into argv before parsing, so the secret flags travel in a 0600 file beside the server's
state (`servers/<port>.keys.yaml`, JSON being YAML) and the command line shows only the
file's path. The same file is where the load generator, /server_info and /flush_cache read
the key on the host: it never crosses SSH in an answer, never sits in argv or a plan.
Standard library only: this module ships.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet.host.agent import safewrite
from gpufleet.host.agent.redact import URL_PASSWORD, is_secret_flag, remember
from gpufleet.host.server.state import SERVERS

API_KEY, ADMIN_KEY = "api-key", "admin-api-key"


def split(argv: list[str], head: int) -> tuple[list[str], dict[str, str]]:
    """argv without its secret flags (and flags whose value holds a URL password) and
    their values; the secrets by option name."""
    public, secrets = list(argv[:head]), {}
    words = argv[head:]
    i = 0
    while i < len(words):
        word = words[i]
        flag, eq, value = word.partition("=")
        if not eq and i + 1 < len(words):
            value = words[i + 1]
        secret = is_secret_flag(flag) or bool(URL_PASSWORD.search(value))
        if word.startswith("--") and secret:
            if not eq:
                if i + 1 >= len(words) or words[i + 1].startswith("--"):
                    public.append(word)  # a bare flag: nothing secret to move
                    i += 1
                    continue
                value = words[i + 1]
                i += 1
            secrets[flag[2:]] = value
        else:
            public.append(word)
        i += 1
    return public, secrets


def key_file(port: int) -> Path:
    return SERVERS / f"{int(port)}.keys.yaml"


def write(port: int, secrets: dict[str, str]) -> Path:
    """The secrets in a 0600 file (atomic); its absolute path."""
    target = safewrite.write_atomic(key_file(port), json.dumps(secrets))
    return Path.cwd() / target


def read(path: str | None) -> dict[str, str]:
    """The secrets a server was launched with ({} when none, or the file is gone)."""
    if not path:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def remember_all() -> None:
    """Every key of this host's servers joins what the agent scrubs from its answers."""
    for path in SERVERS.glob("*.keys.yaml"):
        remember(read(str(path)).values())


def headers(secrets: dict[str, str], admin: bool = False) -> dict[str, str]:
    """`Authorization: Bearer` for a request to this server (the admin key for admin
    endpoints such as /flush_cache when one is set, as SGLang's auth decides)."""
    key = (secrets.get(ADMIN_KEY) if admin else None) or secrets.get(API_KEY)
    return {"Authorization": f"Bearer {key}"} if key else {}
