"""Load a YAML file into a pydantic model, with errors that name file, key path and expectation."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from gpufleet.errors import UserError

M = TypeVar("M", bound=BaseModel)


def read_yaml(path: Path) -> Any:
    """Parse a YAML file; a syntax error becomes one line with file, line and column."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        raise UserError(f"{path}: malformed YAML at {where}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: malformed YAML: {exc}") from None


def describe_validation_error(source: str, exc: ValidationError, prefix: str = "") -> str:
    """One line for the first problem: `file: key.path: what was expected (got X)`."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
    key = ".".join(p for p in (prefix, loc) if p) or "(top level)"
    got = err.get("input")
    message = err["msg"]
    if err["type"] == "extra_forbidden":
        message = "unknown key"
    elif err["type"] == "missing":
        message = "required key is missing"
    shown = "" if err["type"] in ("missing", "extra_forbidden") else f" (got {got!r})"
    more = len(exc.errors()) - 1
    tail = f"; and {more} more problem(s)" if more else ""
    return f"{source}: {key}: {message}{shown}{tail}"


def validate(model: type[M], data: Any, source: str, prefix: str = "") -> M:
    """Validate `data` into `model`; raise UserError with a one-line description on failure."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise UserError(describe_validation_error(source, exc, prefix)) from None
