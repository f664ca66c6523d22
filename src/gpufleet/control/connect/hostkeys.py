"""Strict host-key checking for paramiko clients (Fabric's default would trust any key).

Default: known_hosts is loaded and an unknown key is refused with a message that says how
to trust it. `accept-new` (explicit, per host) records a first-seen key like OpenSSH's
StrictHostKeyChecking=accept-new; a *changed* key is refused in both modes.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import paramiko

from gpufleet.errors import HostError
from gpufleet.kinds import Kind


def known_host_name(address: str, port: int) -> str:
    """The name known_hosts files use: the address, bracketed with the port unless 22."""
    return address if port == 22 else f"[{address}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    """A key's SHA-256 fingerprint, as `ssh-keygen -l` prints it."""
    return key.fingerprint  # "SHA256:..." like ssh-keygen -l


class RefuseUnknownKey(paramiko.MissingHostKeyPolicy):
    """Strict host keys: an unknown key is refused, with the ssh-keyscan line that adds it."""

    def __init__(self, known_hosts: str) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey):
        """Refuse, naming the host, the key's fingerprint and the command that trusts it."""
        host, _, port = hostname.removeprefix("[").partition("]:")
        path = self.known_hosts
        shown = path if path.startswith("~/") and " " not in path else shlex.quote(path)
        folder = os.path.dirname(os.path.expanduser(path))
        mkdir = "" if os.path.isdir(folder) else f"mkdir -p -m 700 {shlex.quote(folder)} && "
        keyscan = f"{mkdir}ssh-keyscan{f' -p {port}' if port else ''} {host} >> {shown}"
        raise HostError(
            f"unknown host key for {hostname} ({key.get_name()} {fingerprint(key)}); "
            f"check the fingerprint, then trust it with `{keyscan}` "
            "or set host_key_policy: accept-new for this host",
            kind=Kind.HOST_KEY,
        )


class AcceptNewKey(paramiko.MissingHostKeyPolicy):
    """Record an unknown key in known_hosts and go on; only when the inventory says so."""

    def __init__(self, known_hosts: str) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey):
        """Trust the key on first use and append it to known_hosts (0600), as ssh's accept-new."""
        client.get_host_keys().add(hostname, key.get_name(), key)
        path = Path(self.known_hosts)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(path, "a") as fh:
            fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        os.chmod(path, 0o600)


def configure(client: paramiko.SSHClient, policy: str, known_hosts: str | None) -> None:
    """Load known_hosts and install the missing-key policy for `policy`."""
    client.load_system_host_keys()
    path = os.path.expanduser(known_hosts or "~/.ssh/known_hosts")
    if known_hosts and os.path.exists(path):
        client.load_host_keys(path)
    if policy == "accept-new":
        client.set_missing_host_key_policy(AcceptNewKey(path))
    else:
        client.set_missing_host_key_policy(RefuseUnknownKey(path))


def file_holding(name: str, known_hosts: str | None) -> str | None:
    """The inventory's known_hosts file when it holds a key for `name` (else the user's
    own ~/.ssh/known_hosts does, which `ssh-keygen -R` edits by default)."""
    if not known_hosts:
        return None
    path = os.path.expanduser(known_hosts)
    try:
        return known_hosts if paramiko.HostKeys(path).lookup(name) else None
    except (OSError, paramiko.SSHException):
        return None


def describe_bad_key(
    exc: paramiko.BadHostKeyException, name: str, known_hosts: str | None = None
) -> str:
    """A changed host key in one line: where the old one is, both fingerprints, and the ssh-
    keygen -R line that forgets it."""
    where = file_holding(name, known_hosts)
    remove = f"ssh-keygen -R {shlex.quote(name)}" + (f" -f {shlex.quote(where)}" if where else "")
    return (
        f"HOST KEY CHANGED for {name}: {where or 'known_hosts'} has "
        f"{fingerprint(exc.expected_key)}, the server offered {fingerprint(exc.key)}; refusing "
        f"to connect. If the change is expected, remove the old key with `{remove}`"
    )
