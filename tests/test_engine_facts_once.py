"""Issue 82, bullet 6: SGLang's facts are stated once (engine_facts.py), messages included.
The census of test_structure.py matched a string that *is* an algorithm's name; this one
reads every string the code says (f-strings' parts too, docstrings aside) for the names
written out as a list, and for SGLang's environment switch, so "EAGLE or EAGLE3" written into a message or
a help text is found, as the skip variable spelled in the tuner beside the rehearsal was."""

from __future__ import annotations

import ast
import re

from helpers import REPO

NAME = r"\b(?:EAGLE3?|STANDALONE)\b"
# a string that is an algorithm's name, a list of them written out ("EAGLE or EAGLE3",
# "EAGLE/EAGLE3"), or SGLang's skip variable; prose naming one ("this EAGLE server") is not
SAID = re.compile(
    rf"^{NAME}$|{NAME}\s*(?:or|and|/|,)\s*{NAME}|SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"
)
# where the names are the facts themselves: the facts, and the rehearsal engine's argument
# parser (SGLang's own list of choices, which it mirrors)
ALLOWED = {"engine_facts.py", "sim/serverargs.py"}


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {
        id(node.body[0].value) for node in ast.walk(tree)
        if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }  # fmt: skip


def spelled(source: str) -> list[tuple[int, str]]:
    """The (line, string) of each string of `source`, docstrings aside, f-strings' literal
    parts included, that spells an algorithm's name or SGLang's skip variable."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    return [
        (node.lineno, node.value) for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in docs and SAID.search(node.value)
    ]  # fmt: skip


def test_sglangs_facts_are_spelled_only_where_they_are_stated():
    root = REPO / "src" / "gpufleet"
    found = [
        f"{path.relative_to(root)}:{line} {text[:60]!r}"
        for path in sorted(root.rglob("*.py"))
        if str(path.relative_to(root)) not in ALLOWED
        for line, text in spelled(path.read_text())
    ]
    assert found == [], "\n".join(found)


def test_the_census_reads_what_a_message_says():
    """It finds the names inside f-strings and prose, not only a string that is a name."""
    assert spelled('x = f"needs EAGLE or EAGLE3 (got {a})"')
    assert spelled('HELP = "SGLang EAGLE/EAGLE3 profiles"')
    assert spelled('ENV = {"SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "1"}')
    assert not spelled('def f():\n    """EAGLE or EAGLE3 in a docstring."""\n    return "eagle3"')
    assert spelled('A = "EAGLE3"') and not spelled('x = "on this EAGLE server"')


def test_messages_name_the_algorithms_the_facts_name():
    from gpufleet import engine_facts
    from gpufleet.cli.tune_tasks import TUNE
    from gpufleet.control.server import engines

    assert engine_facts.named(engine_facts.ADAPTIVE_ALGORITHMS) == "EAGLE or EAGLE3"
    said = engines.ENGINES["sglang"].refuses({"speculative-adaptive": True,
                                              "speculative-algorithm": "NGRAM"})  # fmt: skip
    assert said and "speculative-algorithm EAGLE or EAGLE3 (got NGRAM)" in said
    assert "SGLang EAGLE/EAGLE3" in TUNE.options["profile"].help


def test_the_sglang_family_is_the_adapters_that_run_sglangs_rules():
    """report/compare.py said which engines are SGLang with a name list of its own; the
    facts' list is every adapter that counts its slots by SGLang's rule."""
    from gpufleet import engine_facts
    from gpufleet.control.server import engines

    sglang = engines.ENGINES["sglang"]
    family = {name for name, e in engines.ENGINES.items() if e.slots is sglang.slots}
    assert family == engine_facts.SGLANG_ENGINES
    assert engine_facts.is_sglang(None) and not engine_facts.is_sglang("llamacpp")
    compare = (REPO / "src/gpufleet/report/compare.py").read_text()
    assert '"sim")' not in compare and "is_sglang(" in compare
