"""Server profiles (playbooks/*.yaml) -> validated Profile -> per-host LaunchSpec (argv, env).

A profile names an engine (`sglang`, `sim`, `llamacpp`, `vllm`, or `custom` with a command
template; each engine's facts in control/server/engines.py), the
model, tp, bind host/port, extra server flags (true -> bare flag, false/null -> omitted,
list -> repeated), environment, visible GPUs, `extends` (any depth; cycles and unknown
parents are errors), a health timeout and a log path template under the host workdir.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpufleet.archive.layout import SERVER_LOG, profile_label
from gpufleet.control.inventory import yamlconfig
from gpufleet.control.inventory.model import Host
from gpufleet.control.inventory.yamlconfig import read_yaml, validate
from gpufleet.control.server import engines
from gpufleet.errors import UserError
from gpufleet.host.agent.redact import redact_env, redact_flags, redact_tree, remember, secrets_in
from gpufleet.records import HEALTH_TIMEOUT_S, FlagValue, LaunchSpec
from gpufleet.wire import JsonObject, carried

PLAYBOOKS = Path("playbooks")
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # no '/', no leading '.'
FLAG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class Profile(BaseModel):
    """A resolved profile (after `extends`)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    engine: str = "sglang"  # a name of the adapter registry (engines.NAMES), checked below
    # a program engine's argv template, {python} {model_path} {port} {host} {tp}: custom
    # needs one; llamacpp and vllm have theirs (control/server/engines.py)
    command: list[str] | None = None
    version_command: list[str] | None = None  # prints the engine's version (custom)
    check_flags: bool | None = None  # `program --help` lists its flags (custom: off)
    health_path: str = "/health"
    model_path: str
    tp: int = Field(default=1, ge=1)
    host: str = "127.0.0.1"
    port: int = Field(default=30000, ge=1, le=65535)
    flags: dict[str, FlagValue] = Field(default_factory=dict)
    sim: dict[str, FlagValue] = Field(default_factory=dict)
    env: dict[str, str | int | float | bool] = Field(default_factory=dict)
    gpus: list[int] | None = None  # as CUDA counts them on the host (its CUDA_VISIBLE_DEVICES)
    share_gpus: bool = False  # run beside other gpufleet servers whose profiles share too
    nnodes: int = Field(default=1, ge=1)
    dist_init_port: int = Field(default=50000, ge=1, le=65535)
    health_timeout: float = Field(default=HEALTH_TIMEOUT_S, gt=0)
    log: str = SERVER_LOG
    check_model_path: bool = True
    files: dict[str, str] = Field(default_factory=dict)  # name -> local path; `{file:name}`
    secret_env: list[str] = Field(default_factory=list)  # env names to hide beyond the rules

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, value: str) -> str:
        if value not in engines.NAMES:
            names = ", ".join(f"'{n}'" for n in engines.NAMES[:-1])
            raise ValueError(f"Input should be {names} or '{engines.NAMES[-1]}'")
        return value

    @field_validator("files")
    @classmethod
    def _file_names(cls, files: dict[str, str]) -> dict[str, str]:
        for key in files:
            if not SAFE_NAME.match(key):
                raise ValueError(f"file name {key!r}: letters, digits, '-', '_' and '.' only")
        return files

    @field_validator("flags", "sim")
    @classmethod
    def _flag_names(cls, flags: dict[str, FlagValue]) -> dict[str, FlagValue]:
        for key in flags:
            if not FLAG_NAME.match(key) or key.startswith("-"):
                raise ValueError(f"flag name {key!r}: write it without dashes, e.g. tp-size")
        return flags

    @field_validator("env")
    @classmethod
    def _env_names(
        cls, env: dict[str, str | int | float | bool]
    ) -> dict[str, str | int | float | bool]:
        for key in env:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise ValueError(f"environment variable name {key!r} is not valid")
        return env

    @field_validator("log")
    @classmethod
    def _log_inside_workdir(cls, log: str) -> str:
        if log.startswith("/") or ".." in Path(log).parts:
            raise ValueError("must be a relative path inside the host workdir")
        return log

    @model_validator(mode="after")
    def _custom_needs_command(self) -> Profile:
        if self.engine == "custom" and not self.command:
            raise ValueError('engine custom needs `command` (a list, e.g. ["{python}", ...])')
        return self

    # -- derived ------------------------------------------------------------------
    def flag(self, name: str) -> FlagValue:
        """A flag's value as the profile sets it (None: not set)."""
        return self.flags.get(name)

    @property
    def speculative_algorithm(self) -> str | None:
        """What this profile drafts with, in its engine's words (None: no drafting)."""
        from gpufleet.control.server.engines import engine

        return engine(self.engine).drafts(self.flags)

    @property
    def slots(self) -> int | None:
        """Requests the server serves at once, where its engine and flags say."""
        from gpufleet.control.server.engines import engine

        return engine(self.engine).slots(self.flags)

    def adaptive_problem(self) -> str | None:
        """Why its engine would not run these flags as written (SGLang: adaptive speculation
        it would silently make static), or None."""
        from gpufleet.control.server.engines import engine

        return engine(self.engine).refuses(self.flags)

    def warnings(self) -> list[str]:
        """What its engine would do with these flags silently (SGLang's EAGLE cap)."""
        from gpufleet.control.server.engines import engine

        return [f"{self.name}: {text}" for text in engine(self.engine).warns(self.flags)]


def _flag_args(flags: dict[str, FlagValue]) -> list[str]:
    argv: list[str] = []
    for key, value in flags.items():
        values = value if isinstance(value, list) else [value]
        for v in values:
            if v is None or v is False:
                continue
            argv.append(f"--{key}")
            if v is not True:
                argv.append(str(v))
    return argv


def load_profile(name: str, directory: Path = PLAYBOOKS) -> Profile:
    """Read `name` (a file under playbooks/ or a path), resolving `extends` chains."""
    if name.endswith((".yaml", ".yml")) and Path(name).exists():
        directory = Path(name).parent  # parents of a profile given by path live beside it
    chain: list[str] = []
    merged: JsonObject = {}  # the profile YAMLs, before validation
    current: str | None = name
    sources: list[str] = []
    while current is not None:
        if current in chain:
            cycle = " -> ".join([*chain, current])
            raise UserError(f"{sources[-1]}: extends: cycle {cycle}")
        path = _profile_path(current, directory, referenced_by=sources[-1] if sources else None)
        data = read_yaml(path)
        if not isinstance(data, dict):
            raise UserError(f"{path}: expected a mapping of profile fields")
        chain.append(current)
        sources.append(str(path))
        parent = data.pop("extends", None)
        if parent is not None and not isinstance(parent, str):
            raise UserError(f"{path}: extends: expected a profile name")
        # walking leaf -> root: the child's values win; mappings (flags, env, sim) merge
        merged = yamlconfig.merged(data, merged)
        current = parent
    merged["name"] = profile_label(name)
    if not SAFE_NAME.match(merged["name"]):
        raise UserError(
            f"profile {merged['name']!r}: a profile name becomes a file and archive name: "
            "use letters, digits, '.', '_' and '-' (or give a path ending in .yaml)"
        )
    profile = validate(Profile, merged, sources[0])
    remember(secrets_in(profile.model_dump(), profile.secret_env))  # hidden from all output
    return profile


def _profile_path(name: str, directory: Path, referenced_by: str | None) -> Path:
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") and candidate.exists():
        return candidate
    path = directory / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in directory.glob("*.yaml"))) or "none"
        where = f"{referenced_by}: extends: " if referenced_by else ""
        raise UserError(f"{where}unknown profile {name!r} (in {directory}/: {known})")
    return path


def list_profiles(directory: Path = PLAYBOOKS) -> list[Profile | UserError]:
    """Every profile in the folder, or the error that keeps it from loading."""
    out: list[Profile | UserError] = []
    for path in sorted(directory.glob("*.yaml")):
        try:
            out.append(load_profile(path.stem, directory))
        except UserError as exc:
            out.append(exc)
    return out


def build_specs(
    profile: Profile, hosts: list[Host], engine_override: str | None = None
) -> list[tuple[Host, LaunchSpec]]:
    """One LaunchSpec per host. Multi-node profiles take `nnodes` hosts, ranks in order."""
    problem = profile.adaptive_problem()
    if problem:
        raise UserError(f"profile {profile.name}: {problem}")
    if profile.nnodes > 1 and len(hosts) % profile.nnodes:
        raise UserError(
            f"profile {profile.name} has nnodes {profile.nnodes}: select a multiple of "
            f"{profile.nnodes} hosts (got {len(hosts)})"
        )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    specs = []
    for index, host in enumerate(hosts):
        rank = index % profile.nnodes
        head = hosts[index - rank]
        spec = _spec_for(profile, host, rank=rank, head=head, stamp=stamp, override=engine_override)
        specs.append((host, spec))
    return specs


def _host_port(profile: Profile, host: Host) -> int:
    """A host may move every server port by `vars.server_port_offset` (several simulated
    hosts sharing one machine, or a host where the profile's port is taken)."""
    offset = host.vars.get("server_port_offset", 0)
    if not isinstance(offset, int) or not 0 <= profile.port + offset <= 65535:
        raise UserError(f"host {host.name}: vars.server_port_offset: expected a small integer")
    return profile.port + offset


def _engine_for(profile: Profile, host: Host, override: str | None) -> str:
    if override:
        return override
    if host.gpus.simulated and profile.engine == "sglang":
        return "sim"  # a simulated host cannot run real SGLang: rehearse it
    return profile.engine


def _server_flags(profile: Profile, port: int, rank: int, head: Host) -> dict[str, FlagValue]:
    """The launch flags every SGLang-compatible engine takes, multi-node ones included."""
    flags: dict[str, FlagValue] = {
        "model-path": profile.model_path,
        "tp-size": profile.tp,
        "host": profile.host,
        "port": port,
        **profile.flags,
    }
    if profile.nnodes > 1:
        flags.update(
            {
                "dist-init-addr": f"{head.address}:{profile.dist_init_port}",
                "nnodes": profile.nnodes,
                "node-rank": rank,
            }
        )
    return flags


def _custom_argv(profile: Profile, python: str, port: int) -> list[str]:
    """A program engine's command template (the profile's, else its engine's) filled in,
    then its flags."""
    from gpufleet.control.server.engines import engine

    template = profile.command or list(engine(profile.engine).command or ())
    values = {
        "python": python,
        "model_path": profile.model_path,
        "port": str(port),
        "host": profile.host,
        "tp": str(profile.tp),
    }
    try:
        head_argv = [part.format(**values) for part in template]
    except (KeyError, IndexError, ValueError) as exc:
        raise UserError(
            f"profile {profile.name}: command: unknown placeholder {exc} "
            "(use {python} {model_path} {port} {host} {tp})"
        ) from None
    return [*head_argv, *_flag_args(profile.flags)]


def _argv_for(
    profile: Profile, host: Host, *, engine: str, port: int, rank: int, head: Host
) -> list[str]:
    python = host.python_path
    module = engines.engine(engine).module
    if module is None:
        return _custom_argv(profile, python, port)
    flags = _flag_args(_server_flags(profile, port, rank, head))
    sim = {f"sim-{k}" if not k.startswith("sim-") else k: v for k, v in profile.sim.items()}
    rehearsal = _flag_args(sim) if engine == "sim" else []  # the rehearsal's own flags
    return [python, "-m", module, *flags, *rehearsal]


FILE_REF = re.compile(r"\{file:([^}]*)\}")
MAX_FILE_BYTES = 1 << 20


def _with_files(
    profile: Profile, argv: list[str]
) -> tuple[list[str], dict[str, str], dict[str, dict[str, str]]]:
    """Files that travel with the profile: `{file:NAME}` in a flag becomes the path of the
    file's content-hashed copy in the host workdir (`{files}/<sha256[:12]>-<basename>`,
    written by the agent before launch). Returns (argv, name -> content, what the manifest
    records: name -> path and sha256)."""
    import hashlib

    stored: dict[str, str] = {}
    contents: dict[str, str] = {}
    recorded: dict[str, dict[str, str]] = {}
    for name, local in profile.files.items():
        path = Path(local)
        try:
            data = path.read_bytes()
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(
                f"profile {profile.name}: files.{name}: cannot read {local} "
                f"({exc.__class__.__name__})"
            ) from None
        if len(data) > MAX_FILE_BYTES:
            raise UserError(f"profile {profile.name}: files.{name}: {local} is over 1 MiB")
        digest = hashlib.sha256(data).hexdigest()
        remote = f"{digest[:12]}-{path.name}"
        stored[name], contents[remote] = remote, text
        recorded[name] = {"path": local, "sha256": digest, "stored_as": remote}

    def substitute(word: str) -> str:
        def one(match: re.Match[str]) -> str:
            if match.group(1) not in stored:
                known = ", ".join(sorted(stored)) or "none"
                raise UserError(
                    f"profile {profile.name}: {{file:{match.group(1)}}}: no such entry in "
                    f"files ({known})"
                )
            return "{files}/" + stored[match.group(1)]

        return FILE_REF.sub(one, word)

    return [substitute(word) for word in argv], contents, recorded


def _log_path(profile: Profile, port: int, stamp: str, host: Host) -> str:
    try:
        return profile.log.format(profile=profile.name, port=port, stamp=stamp, host=host.name)
    except (KeyError, IndexError, ValueError) as exc:
        raise UserError(
            f"profile {profile.name}: log: unknown placeholder {exc} "
            "(use {profile} {port} {stamp} {host})"
        ) from None


def _probe_settings(profile: Profile) -> engines.ProbeSettings:
    """What a custom engine's profile says about its version and flag probes."""
    return {"version_command": profile.version_command, "check_flags": profile.check_flags}


def _spec_for(
    profile: Profile, host: Host, *, rank: int, head: Host, stamp: str, override: str | None
) -> LaunchSpec:
    engine = _engine_for(profile, host, override)
    port = _host_port(profile, host)
    env = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in profile.env.items()}
    uses_gpu = engines.engine(engine).uses_gpu(profile.flags)
    gpus, every = engines.server_gpus(engine, profile.flags, profile.tp // profile.nnodes)
    if profile.gpus is not None:  # named: the server sees those only
        gpus, every = profile.gpus, False
    # the host turns these into NVML's numbering and sets CUDA_VISIBLE_DEVICES and
    # CUDA_DEVICE_ORDER from what the server would see there (host/server/placement.py)
    health_host = "127.0.0.1" if profile.host in ("0.0.0.0", "::", "") else profile.host
    resolved = profile.model_dump()
    resolved["env"] = redact_env({k: str(v) for k, v in profile.env.items()}, profile.secret_env)
    resolved["flags"] = redact_flags(profile.flags)
    resolved = redact_tree(resolved)
    argv = _argv_for(profile, host, engine=engine, port=port, rank=rank, head=head)
    argv, files, recorded = _with_files(profile, argv)
    resolved["files"] = recorded
    models = engines.model_files(engine, profile.model_path, profile.flags, argv)
    probes = engines.probes(engine, argv, _probe_settings(profile))
    # the profile's fields and the probes' that the spec declares too are theirs
    return carried(
        LaunchSpec,
        profile,
        probes,
        profile=profile.name,
        engine=engine,
        argv=argv,
        files=files,
        env=env,
        port=port,
        health_host=health_host,
        check_model_path=profile.check_model_path and engine != "sim",
        gpus=gpus,
        log=_log_path(profile, port, stamp, host),
        node_rank=rank,
        warnings=profile.warnings(),
        resolved_profile=resolved,
        renames=list(probes.renames),
        slots=engines.engine(engine).slots(profile.flags),
        needs_gpu=uses_gpu,
        gpus_pinned=profile.gpus is not None,
        gpus_every=every,
        model_paths=models.paths if profile.check_model_path and engine != "sim" else [],
        model_code=models.runs_code,
        model_paths_known=models.known,
        model_trust=host.python_trust,
    )
