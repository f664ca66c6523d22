"""Build the host agent as a zipapp whose file name carries its content hash, and the
bootstrap that runs it (its source compacted, the trust rule inlined: bootstrap_source).

The package boundary is the shipping boundary: the zip holds `gpufleet/host/` and
`gpufleet/sim/` whole (plus the package's `__init__.py`), never a hand-kept file list.
It is byte-for-byte reproducible (sorted entries, fixed timestamps, compiled code in
marshal's reference-free format), so the same code always has the same name and each host
receives it once per version.

Each module travels with its compiled code (a checked hash-based pyc, PEP 552): an agent
start compiled the ~45 modules a verb imports every time (0.05-0.1 s of CPU a start,
benchmarks/agent_start.py). A host
whose Python is another version reads the magic number, skips the pyc and compiles the
source, as before. Compiling costs the control plane 0.13 s, so the built zip is kept in the
user's cache, keyed by its sources and this Python (`cached_build`).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import io
import marshal
import os
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

from gpufleet import layers
from gpufleet.control.agent import bootstrap
from gpufleet.control.agent.once import once
from gpufleet.host.agent import trust

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # src/gpufleet
SHIPPED = (*(f"{name}.py" for name in layers.SHIPPED_BASE), "host", "sim")
# the zip's start-up: the rehearsal engine plugs into the agent's seam here, the one place
# that knows both (host/agent/simulation.py), then the agent runs
MAIN = (
    "import sys\nfrom gpufleet.sim import provider\nprovider.install()\n"
    "from gpufleet.host.dispatch import main\nsys.exit(main(sys.argv[1:]))\n"
)
# what the agent needs beyond the standard library, brought rather than imported from the
# host's site directories (issue 50): NVML's binding (nvidia-ml-py, pure Python on ctypes),
# taken from the control plane's own installation, at the top of the zip as `pynvml`
VENDORED = ("pynvml",)


@dataclass(frozen=True)
class AgentBundle:
    """The agent's zip and its content hash (the file name carries it)."""

    data: bytes
    digest: str

    @property
    def filename(self) -> str:
        """`agent-<hash>.pyz`: each version uploaded once per host."""
        return f"agent-{self.digest[:12]}.pyz"


def vendored_files() -> list[tuple[str, Path]]:
    """(name in the zip, source file) of each vendored module, from this installation."""
    out = []
    for module in VENDORED:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            raise RuntimeError(f"the agent vendors {module}, which this installation lacks")
        out.append((f"{module}.py", Path(spec.origin)))
    return out


def shipped_files() -> list[tuple[str, Path]]:
    """(name in the zip, source file) for everything the agent ships, sorted."""
    out = []
    for entry in SHIPPED:
        path = PACKAGE_ROOT / entry
        if path.is_file():
            out.append((f"gpufleet/{entry}", path))
            continue
        for file in sorted(path.rglob("*.py")):
            out.append((f"gpufleet/{file.relative_to(PACKAGE_ROOT).as_posix()}", file))
    return sorted(out)


# the pyc's flags (PEP 552): hash-based, and the loader checks the source's hash against it
CHECKED_HASH = (0b11).to_bytes(4, "little")
# marshal's format 2 has no back-references: format 4's depend on the objects' reference
# counts, so the same source marshalled in a process that had imported more differed
MARSHAL_FORMAT = 2
CACHE_KEPT = 8  # built zips kept in the user's cache (one per version of the sources)


def compiled(name: str, source: bytes) -> bytes:
    """`source` as a checked hash-based pyc, the same bytes in any process of this Python."""
    code = compile(source, name, "exec", dont_inherit=True)
    header = importlib.util.MAGIC_NUMBER + CHECKED_HASH + importlib.util.source_hash(source)
    return header + marshal.dumps(code, MARSHAL_FORMAT)


@once
def build() -> AgentBundle:
    """The agent, built once per process (`once`)."""
    sources = [("__main__.py", MAIN.encode())] + [
        (name, path.read_bytes()) for name, path in [*shipped_files(), *vendored_files()]
    ]
    data = cached_build(sources)
    return AgentBundle(data=data, digest=hashlib.sha256(data).hexdigest())


def zipped(sources: list[tuple[str, bytes]]) -> bytes:
    """The zip of `sources` (name in the zip, bytes), each .py with its .pyc beside it."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:

        def add(name: str, payload: bytes) -> None:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, payload)

        for name, source in sources:
            add(name, source)
            add(name + "c", compiled(name, source))
    return buffer.getvalue()


def cache_dir() -> Path:
    """Where the built zips are kept: the user's cache (XDG), not the project."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpufleet"


def cached_build(sources: list[tuple[str, bytes]]) -> bytes:
    """The zip of `sources`, from the user's cache when this Python built it before; a
    cache that cannot be read or written only costs the build (0.13 s of CPU)."""
    key = hashlib.sha256(importlib.util.MAGIC_NUMBER + MAIN.encode())
    for name, source in sources:
        key.update(f"{name}\0{len(source)}\0".encode() + source)
    path = cache_dir() / f"agent-build-{key.hexdigest()[:24]}.pyz"
    try:
        return path.read_bytes()
    except OSError:
        pass
    data = zipped(sources)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        partial.write_bytes(data)
        os.replace(partial, path)  # whole or absent: another process may read it now
        _prune(path.parent)
    except OSError:
        pass
    return data


def _prune(directory: Path) -> None:
    """Keep the CACHE_KEPT newest builds: each edit of host/ or sim/ makes another."""
    builds = sorted(directory.glob("agent-build-*.pyz"), key=_mtime, reverse=True)
    for old in builds[CACHE_KEPT:]:
        old.unlink(missing_ok=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _compact(source: str) -> str:
    """The bootstrap's code without docstrings or comments: what `ps` shows on the host."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body[:] = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def _inline_trust(source: str) -> str:
    """The bootstrap's source with host/agent/trust.py in place of its import of it: the host
    has nothing of gpufleet's that may be imported before the hash is checked."""
    tree, rule = ast.parse(source), ast.parse(Path(trust.__file__).read_text())
    rule_body = [
        node for node in rule.body
        if not (isinstance(node, ast.ImportFrom) and node.module == "__future__")
    ]  # fmt: skip
    body: list[ast.stmt] = []
    for node in tree.body:
        inlined = isinstance(node, ast.ImportFrom) and node.module == trust.__name__
        body.extend(rule_body if inlined else [node])
    tree.body = body
    return ast.unparse(tree)


@once
def bootstrap_source() -> str:
    """The `python -c` program that starts every agent; built when a session first starts
    one (17 ms: every CLI process imports this module, most of them before parsing), by
    one thread of a fan-out (`once`)."""
    return _compact(_inline_trust(Path(bootstrap.__file__).read_text()))
