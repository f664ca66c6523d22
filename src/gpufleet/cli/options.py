"""Task options declared once. An `Option` holds everything about a flag: its help, how a
value is checked and bounded, its short flag, which field of the request it sets and, when
the request has that field, its default (the request type's own: BenchRequest, whose shared
defaults are records.BenchPlan's; for gpu-clean, stop and logs, the verb's in
host/agent/protocol.py). An `OptionSet` is a task's options plus its cross-option `Rule`s; from it
come the task's signature (what Invoke parses), its help with the default said, its short
flags, the one-line error a bad value or a bad combination gets, and the parsed options as
one typed value (`parse`), checked before any host is touched.

To add an option to a task: one Option in the set its task is built from (declared beside
the task, in cli/*_tasks.py); nothing else. An option that sets a request field takes its
help and default from that field (BenchRequest declares them: `request.option`), so the
Option adds only how a value is checked. tests/test_structure.py fails when a task reads an
option any other way.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufleet.cli.args import Arg
from gpufleet.cli.common import task, user_errors
from gpufleet.errors import UserError

Check = Callable[[Any, Arg], Any]  # (value as given, the option) -> value
Given = str | int | float | bool | list[str] | None  # a flag's value as Invoke hands it
FROM_REQUEST = object()  # the default is the request field's own


def as_given(value: Any, arg: Arg) -> Any:
    return arg.default if value is None else value


@dataclass(frozen=True)
class Option:
    help: str = ""  # "": the request field's own (its metadata's `help`, control/bench/request.py)
    check: Check = as_given
    field: str | None = None  # the request field it sets (same name when None)
    default: Any = FROM_REQUEST
    default_text: str | None = None  # the default in words when it is computed
    flag_default: Any = None  # what Invoke sees: True/False makes a boolean flag
    iterable: bool = False
    required: bool = False  # positional: `inv sweep baseline,eagle3`
    to_request: bool = True  # False: the task's own (a sweep's --repeat repeats cells)
    short: str | None = None  # one letter, one meaning in every task (-h is always help)
    most: float | None = None  # the bound every number of this option is held to
    expected: str | None = None  # what a number means, for the one line a bad value gets


def switch(help: str, **kwargs: Any) -> Option:
    """A boolean flag, off unless given, that is the task's own."""
    return Option(help, flag_default=False, default=False, to_request=False, **kwargs)


@dataclass(frozen=True)
class Rule:
    """A cross-option rule (Ansible's required_if / mutually_exclusive): `broken(parsed)`
    true means the task stops with `message` before any host is touched."""

    broken: Callable[[Any], bool]
    message: str


class OptionSet:
    """A task's options and rules: its signature, help and parsed value from one declaration."""

    def __init__(
        self, request_type: type | None = None, /, *rules: Rule, **options: Option
    ) -> None:
        self.request_type = request_type
        self.rules = rules
        self.options = options
        fields = dataclasses.fields(request_type) if request_type else ()
        self._fields = {f.name: f for f in fields}

    def __or__(self, other: OptionSet) -> OptionSet:
        return OptionSet(
            self.request_type or other.request_type,
            *self.rules,
            *other.rules,
            **self.options,
            **other.options,
        )

    def only(self, *names: str) -> OptionSet:
        return OptionSet(self.request_type, **{n: self.options[n] for n in names})

    def replace(self, name: str, **changes: Any) -> OptionSet:
        """The same set with one option changed (tune's --concurrency is its ladder)."""
        options = dict(self.options)
        options[name] = dataclasses.replace(options[name], **changes)
        return OptionSet(self.request_type, *self.rules, **options)

    def default(self, name: str) -> Any:
        option = self.options[name]
        if option.default is not FROM_REQUEST:
            return option.default
        field = self._fields.get(option.field or name)
        if field is None:
            return None
        if field.default_factory is not dataclasses.MISSING:
            return field.default_factory()
        return None if field.default is dataclasses.MISSING else field.default

    def unset(self, name: str) -> Any:
        """The value an option has when it is not given (its check applied to nothing)."""
        option = self.options[name]
        if option.flag_default is not None:
            return self.default(name)
        return option.check(None, Arg(self.flag(name), self.default(name), option.most))

    def flag(self, name: str) -> str:
        return "--" + name.replace("_", "-")

    def help_of(self, name: str) -> str:
        """An option's help: its own, else the request field's it sets (declared once, there)."""
        option = self.options[name]
        field = self._fields.get(option.field or name)
        text = option.help or (field.metadata.get("help", "") if field else "")
        if not text:
            raise TypeError(f"option {name}: no help, and no request field declares one")
        return text

    def help(self) -> dict[str, str]:
        out = {}
        for name, option in self.options.items():
            default = option.default_text or self.default(name)
            if isinstance(default, list | tuple):
                default = ",".join(map(str, default))
            unset = default is None or default is False or default == "" or default == []
            said = "" if unset else f" (default {default})"
            out[name.replace("_", "-")] = self.help_of(name) + said
        return out

    def signature(self) -> inspect.Signature:
        params = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        for name, option in self.options.items():
            default = inspect.Parameter.empty if option.required else option.flag_default
            params.append(
                inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
            )
        return inspect.Signature(params)

    @functools.cached_property
    def parsed_type(self) -> type:
        """The parsed options' type: one attribute per option (no string keys to mistype)."""
        return dataclasses.make_dataclass(
            "ParsedOptions", [(name, Any) for name in self.options], frozen=True
        )

    def parse(self, given: dict[str, Given]) -> Any:
        """Each option's checked value (its default when not given), as one value; then the
        rules, so a bad combination stops the task before a host is touched."""
        out = {}
        for name, option in self.options.items():
            value = given.get(name)
            if option.iterable and value == []:
                value = None  # Invoke hands an iterable flag not given as []
            if option.flag_default is not None and value is not None:
                out[name] = bool(value)  # a boolean flag
            else:
                arg = Arg(self.flag(name), self.default(name), option.most, option.expected)
                out[name] = option.check(value, arg)
        parsed = self.parsed_type(**out)
        for rule in self.rules:
            if rule.broken(parsed):
                raise UserError(rule.message)
        return parsed

    def request_fields(self, parsed: Any) -> dict[str, Any]:  # the request type's keywords
        """The parsed values that are request fields, by field name."""
        return {
            option.field or name: getattr(parsed, name)
            for name, option in self.options.items()
            if option.to_request and (option.field or name) in self._fields
        }

    def request(self, parsed: Any) -> Any:
        """The request the parsed options describe (an instance of the set's request type)."""
        assert self.request_type is not None
        return self.request_type(**self.request_fields(parsed))

    def given(self, parsed: Any, leave_out: tuple[str, ...] = ()) -> list[str]:
        """The options that differ from their defaults as command-line words, in declared
        order: what a `--resume` line repeats (a list is the flag repeated; a boolean given
        against its default True is `--no-<flag>`). Parsed again, they give the same options."""
        words: list[str] = []
        for name, option in self.options.items():
            value, default = getattr(parsed, name), self.unset(name)
            if name in leave_out or value is None or value == default or value in ([], {}):
                continue
            flag = self.flag(name)
            if option.flag_default is not None:
                words += [flag] if value else [f"--no-{flag[2:]}"]
                continue
            items = [_word(v) for v in (value if isinstance(value, list | tuple) else [value])]
            if option.iterable and any("," in item for item in items):
                for item in items:  # --grid speculative-num-steps=1,3: the flag repeated
                    words += [flag, item]
            else:
                words += [flag, ",".join(items)]
        return words

    def task(self, **task_kwargs: Any) -> Callable[[Callable[..., Any]], Any]:
        """`@task` whose signature, help and short flags are this set's (the body takes
        `c, **given`)."""

        def wrap(body: Callable[..., Any]) -> Any:
            checked = user_errors(body)

            @functools.wraps(checked)
            def entry(c: Any, *positional: Any, **given: Any) -> Any:
                names = [n for n, o in self.options.items() if o.required]
                given.update(zip(names, positional, strict=False))
                return checked(c, **given)

            entry.__signature__ = self.signature()  # type: ignore[attr-defined]
            iterable = [n for n, o in self.options.items() if o.iterable]
            shorts = {n: o.short for n, o in self.options.items() if o.short}
            return task(help=self.help(), iterable=iterable, short_flags=shorts, **task_kwargs)(
                entry
            )

        return wrap


def _word(value: Any) -> str:
    if isinstance(value, dict):  # --slo ttft_ms=500,tpot_ms=50
        return ",".join(f"{k}={v:g}" for k, v in value.items())
    return str(value)
