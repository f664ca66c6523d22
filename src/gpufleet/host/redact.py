"""What counts as a secret, defined once for both sides, and how it is hidden.

Secrets are environment variables with secret-looking names (HF_TOKEN, *_API_KEY, ...),
the values of secret-looking flags (`--api-key`, `--admin-api-key`, `--hf-token`,
`--password`, ...) and passwords in URLs (`https://user:pass@host`). The host agent hides
them in its state files and in the server-log slices it archives; the control plane in dry
runs, manifests and recorded command lines. Standard library only: this module ships.
"""

from __future__ import annotations

import re
from typing import Any

SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|CREDENTIAL|_KEY$)", re.I
)
SECRET_FLAG_WORD = re.compile(
    r"(^|[-_])(api[-_]?key|token|secret|password|passwd|credentials?|access[-_]?key)($|[-_])",
    re.I,
)
URL_PASSWORD = re.compile(r"([a-z][a-z0-9+.-]*://[^/\s:@]+:)([^/\s@]+)(@)", re.I)
REDACTED = "***"


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Values of variables that look like secrets never reach a manifest, log or dry run."""
    return {k: (REDACTED if SECRET_NAME.search(k) else redact_text(v)) for k, v in env.items()}


def is_secret_flag(flag: str) -> bool:
    """`--api-key`, `--admin-api-key`, `--hf-token`: yes. `--tokenizer-path`: no."""
    return flag.startswith("-") and bool(SECRET_FLAG_WORD.search(flag.lstrip("-")))


def redact_text(text: str) -> str:
    """Passwords in URLs hidden: `https://user:***@host`."""
    return URL_PASSWORD.sub(rf"\g<1>{REDACTED}\g<3>", text)


def redact_argv(argv: list[str]) -> list[str]:
    """argv with the values of secret flags and passwords in URLs replaced by ***."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = word.partition("=")
        if is_secret_flag(flag):
            out.append(f"{flag}={REDACTED}" if eq else word)
            hide_next = not eq
            continue
        out.append(redact_text(word))
    return out


def redact_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """A profile's `flags:` mapping with secret values hidden (names without dashes)."""
    return {
        k: (REDACTED if is_secret_flag("--" + k) and v not in (None, False, True) else v)
        for k, v in flags.items()
    }


def redact_tree(value: Any) -> Any:
    """Every string in nested dicts and lists with URL passwords hidden."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_tree(v) for v in value]
    return value


def process_secrets(pid: int) -> list[str]:
    """The secret values in a running process's argv and environment (as root, or own)."""
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as fh:
            argv = [w.decode(errors="replace") for w in fh.read().split(b"\0") if w]
        with open(f"/proc/{int(pid)}/environ", "rb") as fh:
            pairs = [w.decode(errors="replace").partition("=") for w in fh.read().split(b"\0")]
    except OSError:
        return []
    if len(argv) == 1 and " " in argv[0]:  # a process title (setproctitle) holds argv joined
        argv = argv[0].split()
    return secret_values(argv, {k: v for k, _, v in pairs if k})


def secret_values(argv: list[str], env: dict[str, str]) -> list[str]:
    """The secret values themselves (to scrub from text a server printed)."""
    values = [
        word for word, shown in zip(argv, redact_argv(argv), strict=True) if shown == REDACTED
    ]
    values += [w.split("=", 1)[1] for w in argv if "=" in w and is_secret_flag(w.split("=")[0])]
    values += [m.group(2) for w in argv for m in URL_PASSWORD.finditer(w)]
    values += [v for k, v in env.items() if SECRET_NAME.search(k)]
    return sorted({v for v in values if len(v) >= 4}, key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    """`text` with every secret value replaced by ***."""
    for value in secrets:
        text = text.replace(value, REDACTED)
    return redact_text(text)
