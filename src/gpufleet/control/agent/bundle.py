"""Build the host agent as a zipapp whose file name carries its content hash, and the
bootstrap that runs it (its source compacted, the trust rule inlined: BOOTSTRAP).

The package boundary is the shipping boundary: the zip holds `gpufleet/host/` and
`gpufleet/sim/` whole (plus the package's `__init__.py`), never a hand-kept file list.
It is byte-for-byte reproducible (sorted entries, fixed timestamps), so the same code
always has the same name and each host receives it once per version.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import io
import threading
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from gpufleet import layers
from gpufleet.control.agent import bootstrap
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


_BUILDING = threading.Lock()


def build() -> AgentBundle:
    """The agent, built once per process: the hosts' threads all ask at once, and each
    miss of an unlocked cache would build it again (0.9 s of CPU for 32 hosts)."""
    with _BUILDING:
        return _build()


@lru_cache(maxsize=1)
def _build() -> AgentBundle:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:

        def add(name: str, payload: bytes) -> None:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, payload)

        add("__main__.py", MAIN.encode())
        for name, path in [*shipped_files(), *vendored_files()]:
            add(name, path.read_bytes())
    data = buffer.getvalue()
    return AgentBundle(data=data, digest=hashlib.sha256(data).hexdigest())


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


BOOTSTRAP = _compact(_inline_trust(Path(bootstrap.__file__).read_text()))
