"""What counts as a secret, defined once for both sides, and how it is hidden.

Secrets are environment variables with secret-looking names (HF_TOKEN, *_API_KEY, ...),
the values of secret-looking flags (`--api-key`, `--admin-api-key`, `--hf-token`,
`--password`, ...) and passwords in URLs (`https://user:pass@host`). The host agent hides
them in its state files and in the server-log slices it archives; the control plane in dry
runs, manifests and recorded command lines. Standard library only: this module ships.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterable
from typing import Any

from gpufleet.records import FlagValue

SECRET_PARTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "API_KEY", "ACCESSKEY",
                "ACCESS_KEY", "CREDENTIAL")  # fmt: skip
SECRET_WORDS = {"token", "secret", "password", "passwd", "credential", "credentials"}
SECRET_PAIRS = {("api", "key"), ("access", "key")}
# Every pattern here runs on whole server logs and on agent input: each is linear in the
# text (a match starts only where a word starts; values are scanned once, see
# _hide_values), and tests/test_input_limits.py feeds every regex in gpufleet 1 MB of
# adversarial text.
URL_PASSWORD = re.compile(r"(://(?<=[a-z0-9+.-]://)[^/\s:@]+:)([^/\s@]+)(@)", re.I)
REDACTED = "***"
# `api_key='abc'` (a ServerArgs repr), `"hf_token": "abc"` (JSON, also inside a JSON
# string), `HF_TOKEN=abc` (an environment dump)
KEY_VALUE = re.compile(
    r"(?P<key>(?<![\w-])[A-Za-z_][\w-]*)(?P<q1>\\?[\"'])?(?P<sep>\s*[=:]\s*(?:\\?[\"'])?)"
)
KEY_VALUE_TEXT = re.compile(r"[^\s\"'\\,;()}\][{&=]+")
# `--api-key abc`, `--api-key=abc`, `"--api-key", "abc"` (an argv list as JSON). A flag
# follows a space, a quote or a bracket (the text is scanned with a space in front): a
# leading character class lets the engine skip the rest in C, and the separator is
# looked at ahead, not consumed, so it can lead the next flag.
FLAG_VALUE = re.compile(
    r"[\s\"'\[,(={](?P<key>--[A-Za-z0-9][\w-]*)(?=(?P<sep>=|\s+|\\?[\"']\s*,\s*\\?[\"']))"
)
FLAG_VALUE_TEXT = re.compile(r"[^\s\"'\\,\]]+")
NOT_SECRET = re.compile(r"^(-.*|\*\*\*|none|null|true|false|[-+]?[0-9.]+(e[-+]?[0-9]+)?)$", re.I)


def redact_env(env: dict[str, str], secret_names: Iterable[str] = ()) -> dict[str, str]:
    """Values of variables that look like secrets (or a profile declares, `secret_env:`)
    never reach a manifest, log or dry run."""
    declared = set(secret_names)
    return {
        k: (REDACTED if secret_variable(k) or k in declared else redact_text(v))
        for k, v in env.items()
    }


_KNOWN: set[str] = set()


def remember(values: Iterable[str]) -> None:
    """Secret values this process has seen (a profile's key, an inventory's token): from
    now on scrub_known hides them wherever they appear, whatever the surrounding text."""
    _KNOWN.update(v for v in values if isinstance(v, str) and len(v) >= 4 and v != REDACTED)


def scrub_known(text: str) -> str:
    """`text` with every remembered secret value and every secret-looking value hidden."""
    return scrub(text, sorted(_KNOWN, key=len, reverse=True))


def scrub_known_tree(value: Any) -> Any:
    """`scrub_tree` with every remembered secret value (what the agent answers with)."""
    return scrub_tree(value, sorted(_KNOWN, key=len, reverse=True))


def scrub_tree(value: Any, secrets: list[str]) -> Any:
    """`value` (JSON-able: dicts, lists, strings, numbers) with secrets hidden in its
    strings, never in the text it serialises to: a secret's value is another user's to
    choose (a run_as server's environment), and `": "` replaced in serialised JSON made
    every line the agent sent unreadable. Also hidden: the value under a secret-looking
    key (`{"api_key": ...}`) and the word after a secret flag in a list (`["--api-key",
    ...]`), which the serialised text's patterns used to find. Keys are kept: a message's
    shape is gpufleet's, not a value's. Other objects become their str(), scrubbed."""
    if isinstance(value, str):
        return scrub(value, secrets)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, dict):
        return {
            k: REDACTED if _secret_entry(k, v) else scrub_tree(v, secrets) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        out: list[Any] = []
        flag = False  # the previous word was a secret flag: this one is its value
        for item in value:
            out.append(REDACTED if flag and isinstance(item, str) else scrub_tree(item, secrets))
            flag = isinstance(item, str) and "=" not in item and is_secret_flag(item)
        return out
    return scrub(str(value), secrets)


def _secret_entry(key: Any, value: Any) -> bool:
    """A dict entry whose string value is a secret by its key's name (`api_key`, `HF_TOKEN`)."""
    return (
        isinstance(key, str)
        and isinstance(value, str)
        and is_secret_name(key)
        and not NOT_SECRET.match(value)
    )


def secrets_in(value: Any, secret_names: Iterable[str] = ()) -> list[str]:
    """Secret values inside nested config (a profile, inventory vars): the values of
    secret-looking or declared names, and passwords in URLs."""
    declared = set(secret_names)
    found: list[str] = []

    def walk(item: Any, name: str = "") -> None:
        if isinstance(item, dict):
            for key, inner in item.items():
                walk(inner, str(key))
        elif isinstance(item, list):
            for inner in item:
                walk(inner, name)
        elif isinstance(item, str):
            if name and (is_secret_name(name) or secret_variable(name) or name in declared):
                found.append(item)
            found.extend(m.group(2) for m in URL_PASSWORD.finditer(item))

    walk(value)
    return found


def secret_variable(name: str) -> bool:
    """An environment variable's name that holds a secret: `HF_TOKEN`, `OPENAI_API_KEY`,
    `DB_PASSWORD`, anything ending `_KEY` (substring tests: linear, whatever the name)."""
    upper = name.upper()
    return upper.endswith("_KEY") or any(part in upper for part in SECRET_PARTS)


def _secret_words(name: str) -> bool:
    """A word of a `-`/`_` separated name is a secret's: `api-key`, `hf_token`, `apikey`."""
    words = name.lower().replace("_", "-").split("-")
    if any(w in SECRET_WORDS or w in ("apikey", "accesskey") for w in words):
        return True
    return any(pair in SECRET_PAIRS for pair in itertools.pairwise(words))


def is_secret_flag(flag: str) -> bool:
    """`--api-key`, `--admin-api-key`, `--hf-token`: yes. `--tokenizer-path`: no."""
    return flag.startswith("-") and _secret_words(flag.lstrip("-"))


@functools.lru_cache(maxsize=4096)  # a log repeats its names; scrubbing asks per match
def is_secret_name(name: str) -> bool:
    """`api_key`, `admin-api-key`, `HF_TOKEN`, `password`: yes. `max_new_tokens`: no."""
    name = name.strip("-")
    return _secret_words(name) or (name.isupper() and secret_variable(name))


def _hide_values(text: str, pattern: re.Pattern[str], value_text: re.Pattern[str]) -> str:
    """Replace the value after every secret-looking name. `pattern` matches the name and
    its separator only, so `env: HF_TOKEN=abc` still finds HF_TOKEN after the non-secret
    `env:`; a value is scanned only after a secret name, and once: names inside a value
    already scanned are not looked at again (linear, whatever the text)."""
    text = " " + text  # a name at the very start has a space before it, like the others
    out, last, scanned = [], 0, 0
    for match in pattern.finditer(text):
        start = match.end("sep")
        if start < scanned or not is_secret_name(match.group("key")):
            continue
        value = value_text.match(text, start)
        if value is None:
            continue
        scanned = value.end()
        if NOT_SECRET.match(value.group()):
            continue
        out += [text[last:start], REDACTED]
        last = scanned
    return ("".join(out) + text[last:])[1:]


def redact_text(text: str) -> str:
    """Secrets in free text hidden: passwords in URLs (`https://user:***@host`), values of
    secret-looking names (`api_key='***'`, `"hf_token": "***"`, `HF_TOKEN=***`) and of
    secret flags (`--api-key ***`). Numbers, booleans and None are left: not secrets."""
    text = URL_PASSWORD.sub(rf"\g<1>{REDACTED}\g<3>", text)
    return _hide_values(_hide_values(text, FLAG_VALUE, FLAG_VALUE_TEXT), KEY_VALUE, KEY_VALUE_TEXT)


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


def redact_flags(flags: dict[str, FlagValue]) -> dict[str, FlagValue]:
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
    values += [v for k, v in env.items() if secret_variable(k)]
    return sorted({v for v in values if len(v) >= 4}, key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    """`text` with every secret value replaced by ***."""
    for value in secrets:
        text = text.replace(value, REDACTED)
    return redact_text(text)
