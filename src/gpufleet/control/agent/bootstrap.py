"""The agent's bootstrap: the only code that runs on a host before the agent's hash is known.

Its source travels as `python -I -S -c SOURCE WORKDIR AGENT SHA256 VERB...`, with the trust
rule (host/agent/trust.py) inlined in front of it, after the control plane has judged that
python's whole tree from outside it (control/agent/python_trust.py). `-I` keeps the workdir,
PYTHONPATH, PYTHONSTARTUP and the user site out of sys.path, so nothing a local user drops
next to the agent (a `hashlib.py`) is imported as root; `-S` keeps `site` from running, so
no `.pth` line executes and no site directory is on the agent's path: root's agent imports
the standard library and what its zip brings (issue 50). The workdir is judged by the trust
rule, missing directories created 0700 on the way; nothing that exists is chmod'ed. The
agent's bytes are read once through an O_NOFOLLOW descriptor, hashed, and run from memory.
Standard library only, imported from the stdlib alone.

Arguments: WORKDIR AGENT SHA256 PYTHON_TRUST (refuse or warn) VERB... Exit codes: 90 the
workdir cannot be created, 91 refused (untrusted path or agent file).
The agent (`serve`) says the workdir's real path in its first line.
"""

from __future__ import annotations

import sys

sys.path[:] = [p for p in sys.path if p not in ("", ".")]  # belt and braces beside -I
import os  # noqa: E402
import stat  # noqa: E402

from gpufleet.host.agent.trust import (  # noqa: E402  (inlined)
    FILE,
    WORKDIR,
    Untrusted,
    judge,
    judge_entries,
    judge_tree,
    site_directories,
)

MISSING = "gpufleet-agent-missing"
WARNING = "gpufleet-warning:"  # a line the control plane shows once per host


def main(argv: list[str]) -> int:
    """Judge the workdir and the interpreter's tree, then run the agent whose hash matches, from
    memory; exit codes the session reads (91: untrusted)."""
    workdir, agent, digest, python_trust = argv[1:5]
    try:
        real = judge(os.path.expanduser(workdir), os.geteuid(), WORKDIR, "workdir", create=True)
    except Untrusted as exc:
        sys.stderr.write(f"{exc}\n")
        return 91
    except OSError as exc:
        sys.stderr.write(f"cannot create workdir {workdir}: {exc.strerror} ({exc.filename})\n")
        return 90
    os.chdir(real)
    try:
        module_directories(os.geteuid())
        system_files(os.geteuid())
    except Untrusted as exc:
        if python_trust != "warn":  # a lab machine's shared venv, said and run
            sys.stderr.write(f"{exc}\n")
            return 91
        sys.stderr.write(f"{WARNING} running an untrusted python (python_trust: warn): {exc}\n")
    try:
        # everything gpufleet keeps here (servers/, runs/, files/, logs/, the rehearsal's
        # sim-gpus/) is read and written by root: judged before any of it is used
        judge_tree(real, os.geteuid(), (), "the workdir")
    except Untrusted as exc:
        sys.stderr.write(f"{exc}\n")
        return 91
    try:
        fd = os.open(agent, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        sys.stdout.write(f"{MISSING} {real}\n")
        return 0
    except OSError:
        sys.stderr.write(f"{real}/{agent} is not a file of this user\n")
        return 91
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            sys.stderr.write(f"{real}/{agent} is not a file of this user\n")
            return 91
        data = fh.read()
    import hashlib

    if hashlib.sha256(data).hexdigest() != digest:
        sys.stderr.write(
            f"{agent} does not match the agent gpufleet built (sha256 {digest[:12]}...): "
            "remove it and gpufleet uploads its own\n"
        )
        return 91
    sys.argv = [os.path.join(real, agent), *argv[5:]]
    run_from_memory(sys.argv[0], data)
    return 0


def module_directories(uid: int) -> None:
    """Every directory a later import can read from passes the trust rule, before the agent
    imports anything beyond the standard library's core: the trees under sys.path (the
    standard library: the agent runs under -S) and the site directories the host python's
    other starts (the server, its probes, the bench client) import from. The control plane
    judged the tree's top (executable, pyvenv.cfg, site directories, .pth files, the
    standard library's entries) from outside, before this python ran."""
    roots = list(dict.fromkeys(p for p in [*sys.path, *site_directories()] if os.path.isdir(p)))
    for root in roots:
        nested = [p for p in roots if p != root and p.startswith(root + "/")]
        skip = [os.path.join(root, name) for name in ("site-packages", "dist-packages")]
        judge_tree(root, uid, tuple(nested + skip), "the host python's module directory")


# where distributions keep OpenSSL's configuration (its OPENSSLDIR): hashlib and ssl load
# it, and a provider or engine it names is a library root would load
OPENSSL_CONFIGS = ("/usr/lib/ssl/openssl.cnf", "/etc/ssl/openssl.cnf",
                   "/usr/local/ssl/openssl.cnf", "/etc/pki/tls/openssl.cnf")  # fmt: skip


def system_files(uid: int) -> None:
    """What the C side loads for the agent beyond its module directories, judged before
    the agent imports anything that loads it (zipfile loads libbz2, hashlib OpenSSL and its
    configuration): each file of the loader's directories this process already maps
    (libpython's, libc's), with glibc's iconv modules and their cache, and OpenSSL's
    configuration. A file there that another user owns was loaded as root (the census of
    files: tests/test_trust_census_files.py)."""
    directories = set()
    with open("/proc/self/maps") as fh:
        for line in fh:
            fields = line.split(None, 5)
            if len(fields) == 6 and ".so" in os.path.basename(fields[5].strip()):
                directories.add(os.path.dirname(fields[5].strip()))
    for directory in sorted(directories):
        judge_entries(directory, uid, "a library directory of the host python")
        gconv = os.path.join(directory, "gconv")
        if os.path.isdir(gconv):
            judge_entries(gconv, uid, "glibc's iconv modules")
    for config in OPENSSL_CONFIGS:
        if os.path.lexists(config):
            judge(config, uid, FILE, "OpenSSL's configuration")


def run_from_memory(path: str, data: bytes) -> None:
    """Run the zipapp from the very bytes that were hashed: its modules are imported from
    memory, so nothing re-opens the file by path between the check and the use. `__file__`
    still names the path inside the zip, as zipimport would, for the children that the
    agent starts with the zip on their PYTHONPATH."""
    import _imp
    import importlib.abc
    import importlib.util
    import io
    import marshal
    import zipfile

    archive = zipfile.ZipFile(io.BytesIO(data))
    names = set(archive.namelist())

    def code_of(inner, origin):
        """The module's code: the zip's pyc where this Python compiled these very bytes
        (its magic number and the source's hash match), else compiled here."""
        source = archive.read(inner)
        pyc = archive.read(inner + "c") if inner + "c" in names else b""
        if (pyc[:4] == importlib.util.MAGIC_NUMBER
                and pyc[8:16] == importlib.util.source_hash(source)):  # fmt: skip
            code = marshal.loads(pyc[16:])
            _imp._fix_co_filename(code, origin)  # tracebacks name the file in the zip
            return code
        return compile(source, origin, "exec")

    class FromMemory(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, target_path=None, target=None):
            base = fullname.replace(".", "/")
            for inner, package in ((base + "/__init__.py", True), (base + ".py", False)):
                if inner in names:
                    return importlib.util.spec_from_file_location(
                        fullname, f"{path}/{inner}", loader=self,
                        submodule_search_locations=[f"{path}/{base}"] if package else None,
                    )  # fmt: skip
            return None

        def exec_module(self, module):
            inner = module.__spec__.origin[len(path) + 1 :]
            exec(code_of(inner, module.__spec__.origin), module.__dict__)

    sys.meta_path.insert(0, FromMemory())
    main_code = code_of("__main__.py", f"{path}/__main__.py")
    exec(main_code, {"__name__": "__main__", "__file__": f"{path}/__main__.py"})


if __name__ == "__main__":
    sys.exit(main(sys.argv))
