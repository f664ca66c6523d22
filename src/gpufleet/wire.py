"""Checked JSON records: a dataclass that reads itself from decoded JSON and says, with a
path, where the data does not match its declared type
(`bench-start.plan.levels[0].concurrency: 'x' is not int`), so a renamed or mistyped key
fails where the record is read, not later as a KeyError on a GPU host.

Standard library only: this module ships in the host agent and is used by the archive too.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from typing import Any

from gpufleet.kinds import Kind

JsonObject: typing.TypeAlias = dict[str, Any]
"""A JSON object whose shape someone else owns, as decoded: a foreign API's request or
answer (SGLang's /server_info, an OpenAI body), a YAML or JSON file as read before it is
validated. Inside gpufleet data travels as declared records (Record below) and leaves as
JsonDict; tests/test_structure.py counts what is left of this name (each use says whose
shape it is, in a comment)."""

JsonValue: typing.TypeAlias = bool | int | float | str | list[Any] | dict[str, Any] | None
"""A value JSON holds: what a declared record, a verdict or a table becomes on its way out
(`to_wire`, `to_json`), or a field that keeps another declared record's JSON form (a
manifest's resolved profile, its bench request). The keys and their types are the
producing class's (named where it is used); `check` takes any JSON-decoded value for it."""

JsonDict: typing.TypeAlias = dict[str, JsonValue]
"""A declared record's JSON form (see JsonValue)."""


class WireError(Exception):
    """A record that does not match its declared type (the agent answers bad_input)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.kind = Kind.BAD_INPUT


class Record:
    """A dataclass that reads and writes itself as JSON-compatible data, checked.

    An open record (OPEN = True, with an `extra` field) keeps keys it does not declare in
    `extra` and writes them back flat: a row that also carries another tool's own keys
    (bench_serving's, which change between its versions) passes them through unchecked.
    """

    OPEN: typing.ClassVar[bool] = False

    @classmethod
    def from_wire(cls, data: Any, where: str = "") -> typing.Self:
        where = where or cls.__name__
        if not isinstance(data, dict):
            raise WireError(f"{where}: expected a JSON object")
        hints, fields = _declared(cls)
        unknown = sorted(set(data) - {f.name for f in fields})
        values: dict[str, object] = {}  # field -> its checked value
        if cls.OPEN:
            values["extra"] = {k: data[k] for k in unknown}
            fields = [f for f in fields if f.name != "extra"]
        elif unknown:
            raise WireError(f"{where}: unknown field(s) {unknown}")
        for f in fields:
            if f.name in data:
                values[f.name] = check(data[f.name], hints[f.name], f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise WireError(f"{where}: missing field {f.name!r}")
        return cls(**values)

    def to_wire(self) -> JsonDict:
        data = dataclasses.asdict(self)  # type: ignore[call-overload]
        if self.OPEN:
            data.update(data.pop("extra"))
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_wire(), indent=2)


@functools.cache
def _declared(cls: type[Record]) -> tuple[dict[str, object], list[dataclasses.Field[Any]]]:  # hints
    """A record's resolved type hints and init fields, worked out once per class (a fleet's
    answers are read by the thousand; resolving hints is most of a small record's cost)."""
    fields = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    return typing.get_type_hints(cls), fields


@functools.cache
def _shape(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    return typing.get_origin(hint), typing.get_args(hint)


@functools.cache
def _keys(hint: Any) -> tuple[dict[str, object], frozenset[str]]:  # a TypedDict's hints
    """A TypedDict's key hints and its required keys, read from the hints themselves: under
    `from __future__ import annotations` Python 3.11's __required_keys__ misses NotRequired."""
    extras = typing.get_type_hints(hint, include_extras=True)
    required = {
        key
        for key, declared in extras.items()
        if typing.get_origin(declared) is not typing.NotRequired
        and (hint.__total__ or typing.get_origin(declared) is typing.Required)
    }
    return typing.get_type_hints(hint), frozenset(required)


def _check_keys(value: Any, hint: Any, where: str) -> Any:
    """A TypedDict's declared keys checked like a record's fields; keys it does not declare
    pass through (a newer writer's), as JSON objects allow."""
    if not isinstance(value, dict):
        raise WireError(f"{where}: expected a JSON object")
    hints, required = _keys(hint)
    missing = sorted(required - set(value))
    if missing:
        raise WireError(f"{where}: missing field(s) {missing}")
    return {k: check(v, hints[k], f"{where}.{k}") if k in hints else v for k, v in value.items()}


_EXACT = (str, int, bool)  # a value of exactly this type matches the same hint as is


def check(value: Any, hint: Any, where: str) -> Any:
    """`value` if it has the declared JSON type (ints accepted for floats, nested records
    read with their own from_wire), else WireError."""
    if hint is type(value) and hint in _EXACT:  # the common case, first
        return value
    if hint is JsonValue:  # decoded JSON is a JSON value by construction
        return value
    origin, args = _shape(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # `X | None`: X's own message, with the path inside it
            return check(value, options[0], where)
        for option in options:
            try:
                return check(value, option, where)
            except WireError:
                continue
        raise WireError(f"{where}: {value!r} is not {hint}")
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint.from_wire(value, where)
    if typing.is_typeddict(hint):
        return _check_keys(value, hint, where)
    if hint is type(None):
        ok = value is None
    elif hint is Any:
        ok = True
    elif hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif origin is list:
        ok = isinstance(value, list)
        if ok:
            [item_hint] = args or [Any]
            value = [check(v, item_hint, f"{where}[{i}]") for i, v in enumerate(value)]
    elif origin is dict or hint is dict:
        ok = isinstance(value, dict)
        if ok and args:
            _, value_hint = args
            value = {k: check(v, value_hint, f"{where}.{k}") for k, v in value.items()}
    else:
        ok = isinstance(value, hint)
    if not ok:
        raise WireError(f"{where}: {value!r} is not {getattr(hint, '__name__', hint)}")
    return value


T = typing.TypeVar("T")


def carried(target: type[T], *sources: Any, **own: Any) -> T:
    """A `target` (a dataclass) built from what each source declares under the same names (a
    dataclass's fields or a pydantic model's; a later source wins), `own` added or
    replacing: a value built from others in one place, so a field both declare is carried
    without a line of its own (control/bench/run.py builds the plan from the request)."""
    names = {f.name for f in dataclasses.fields(target)}  # type: ignore[arg-type]
    shared = [
        (name, getattr(source, name))
        for source in sources
        for name in getattr(type(source), "model_fields", None)
        or [f.name for f in dataclasses.fields(source)]
        if name in names
    ]
    return target(**(dict(shared) | own))
