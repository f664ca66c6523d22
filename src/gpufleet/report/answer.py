"""A comparison's answer, built once: the sentence's claims (each with its interval and
whether it is significant), the warnings with their severity, and the ratios of the table.

The terminal (cli/output.py), summary.md (`to_markdown`), report.html (report/html.py) and
`--format json` all render this one object, so they cannot disagree: a ratio printed
`0.75x [0.52-1.08] n.s.` in one place is never a plain red `0.75x` in another, and the
sentence claims a difference only where its interval excludes none.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from gpufleet.report import catalogue
from gpufleet.report.compare import (
    Arm,
    Crossing,
    client_bound,
    common_levels,
    crossover,
    crossover_text,
    figure,
    level_bound,
    notices,
)
from gpufleet.report.compare import Notice as Notice
from gpufleet.report.compare import Severity as Severity
from gpufleet.report.markdown import md_cell, md_table
from gpufleet.report.stats import ratio_ci, ratio_text, with_interval
from gpufleet.report.verdicts import Verdict, by_verdict, levels_text, tested, verdict, verdicts
from gpufleet.wire import JsonDict

PER_REQUEST = catalogue.PER_REQUEST
TOTAL = catalogue.THROUGHPUT


@dataclass
class Claim:
    """One thing the sentence says. `significant`: True or False where repeats give an
    interval, None where one run per arm gives none."""

    text: str
    significant: bool | None = None
    level: int | None = None


@dataclass
class Ratio:
    """One ratio cell of the table: B/A for a figure at a level, with its interval."""

    level: int
    key: str
    arm: str
    text: str  # `0.75x [0.52-1.08] n.s.`, or `1.32x` without repeats
    significant: bool | None
    better: bool | None  # B is better than A on this figure (None: no direction)


@dataclass
class Answer:
    """One host's comparison, as every renderer shows it."""

    host: str
    labels: list[str]
    levels: list[int]
    claims: list[Claim] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    ratios: list[Ratio] = field(default_factory=list)
    others: list[list[Claim]] = field(default_factory=list)  # the third arm on, each vs the first

    @property
    def sentence(self) -> str:
        """The second arm against the first (the reference)."""
        if not self.claims:
            return "nothing to compare: " + (
                "no common concurrency levels" if len(self.labels) > 1 else "one arm"
            )
        return "; ".join(c.text for c in self.claims) + "."

    @property
    def sentences(self) -> list[str]:
        """One sentence per arm after the first, each against the first: a sweep of a target
        and three drafts answers for every draft."""
        return [self.sentence] + ["; ".join(c.text for c in claims) + "." for claims in self.others]

    @property
    def errors(self) -> list[Notice]:
        return [n for n in self.notices if n.severity == Severity.ERROR]

    @property
    def warnings(self) -> list[Notice]:
        return [n for n in self.notices if n.severity == Severity.WARNING]

    def facts(self) -> list[str]:
        """What every rendering must carry: each claim, each notice, and the ratios of the
        headline figures (the terminal's default table shows those; md and the page all)."""
        headline = {m.key for m in catalogue.where(catalogue.Place.HEADLINE) if m.higher_is_better}
        return (
            [c.text for claims in [self.claims, *self.others] for c in claims]
            + [n.text for n in self.notices]
            + [r.text for r in self.ratios if r.key in headline]
        )

    def to_json(self) -> JsonDict:
        data = asdict(self)
        data["sentence"] = self.sentence
        data["sentences"] = self.sentences
        return data


def build(host: str, arms: list[Arm]) -> Answer:
    """The answer for one host's arms (the first is the reference)."""
    levels = common_levels(arms)
    found = notices(arms, levels) + itl_bases(arms, levels)
    answer = Answer(host, [a.label for a in arms], levels, notices=found)
    answer.ratios = ratios(arms, levels)
    if len(arms) > 1 and levels:
        answer.claims = claims(arms[0], arms[1], levels, answer.notices)
        answer.others = [claims(arms[0], arm, levels, answer.notices) for arm in arms[2:]]
    return answer


def itl_bases(arms: list[Arm], levels: list[int]) -> list[Notice]:
    """Levels where one arm's ITL is per chunk (no chunk's tokens knowable) and the
    first's per token, or the other way: a 4-token chunk reads 4x the gap, so the ITL
    ratio there compares two definitions."""
    out = []
    for arm in arms[1:]:
        pair = [(a.label, {c for c in levels if a.levels[c].get("itl_basis") == "chunk"})
                for a in (arms[0], arm)]  # fmt: skip
        split = sorted(pair[0][1] ^ pair[1][1])
        if split:
            (one, _), (other, _) = sorted(pair, key=lambda p: split[0] not in p[1])
            out.append(Notice(Severity.WARNING, f"ITL per chunk in {one}, per token in "
                              f"{other} at C={','.join(map(str, split))}: the ITL ratio "
                              "there compares two definitions", "tokens"))  # fmt: skip
    return out


def ratios(arms: list[Arm], levels: list[int]) -> list[Ratio]:
    """Every arm against the first, for every figure the catalogue gives a ratio."""
    out = []
    for m in catalogue.where(catalogue.Place.RATIO):
        for c in levels:
            for arm in arms[1:]:
                a, b = arms[0].levels[c], arm.levels[c]
                text = ratio_text(a, b, m.key)
                if text == "-":
                    continue
                interval = ratio_ci(a, b, m.key)
                significant = None if interval is None else not interval[0] <= 1.0 <= interval[1]
                up = float(b.get(m.key)) > float(a.get(m.key))
                better = None if m.higher_is_better is None else up == m.higher_is_better
                out.append(Ratio(c, m.key, arm.label, text, significant, better))
    return out


def claims(a: Arm, b: Arm, levels: list[int], found: list[Notice]) -> list[Claim]:
    """The sentence, claim by claim: per-request speed, total throughput (each crossover
    with its interval), the top level's ratio only where it is significant, then what
    weakens the answer (unequal GPUs, overloaded or client-bound levels, energy). Only
    the levels both arms measured (completed a request at) are compared: an arm that
    measured nothing gets no direction, only its failure."""
    levels = [c for c in levels if a.levels[c].measured and b.levels[c].measured]
    if not levels:
        failed = [arm.label for arm in (a, b) if not any(v.measured for v in arm.levels.values())]
        why = (
            f"{' and '.join(failed)} measured nothing (every request failed)"
            if failed
            else "no level where both arms completed a request"
        )
        return [Claim(f"nothing to compare: {why}")]
    repeats = any(arm.levels[c].ci for arm in (a, b) for c in levels)
    out = [_per_request(a, b, levels), _total(a, b, levels), _top(a, b, levels)]
    gpu_errors = [n for n in found if n.severity == Severity.ERROR and n.topic == "gpu"]
    if gpu_errors:
        what = ", ".join(dict.fromkeys(n.subject for n in gpu_errors))
        out.append(Claim(f"but the arms ran on unequal GPUs ({what}): part of any difference "
                         "may be the GPUs', not the configurations'"))  # fmt: skip
    overloaded = [
        (arm.label, c) for arm in (a, b) for c in levels if arm.levels[c].get("overloaded")
    ]
    if overloaded:
        where = ", ".join(f"{label} at C={c}" for label, c in overloaded)
        out.append(Claim(f"{where} could not keep up with the offered rate (overloaded): "
                         "latencies there follow a queue"))  # fmt: skip
    bound = sorted({c for arm in (a, b) for c, _ in client_bound(arm, levels)})
    if bound:
        out.append(Claim(
            f"the client was the bottleneck at C={','.join(map(str, bound))}: figures there, "
            "and any crossover they place, measure the load generator as much as the server"
        ))  # fmt: skip
    approximated = _approximated(a, b, levels)
    if approximated:
        out.append(approximated)
    energy = _energy(a, b, levels)
    if energy:
        out.append(energy)
    if not repeats:
        runs = max((arm.levels[c].repeats for arm in (a, b) for c in levels), default=1)
        said = "one run per arm" if runs < 2 else f"{runs} runs per arm are too few"
        out.append(Claim(f"{said}, so no interval: --repeat 3 gives each figure one"))
    return out


def _crossing_claim(kind: Crossing, where: str, texts: dict[Crossing, str]) -> Claim:
    return Claim(texts[kind].format(where=where))


def _supported(kind: Crossing, at: float | None, levels: list[int], found: list[Verdict]) -> bool:
    """Whether the tested verdicts bear out what the crossing's words claim: a direction
    only where a level's test found it, and none the tests contradict."""
    below = [v for c, v in zip(levels, found, strict=True) if at is None or c < at]
    above = [v for c, v in zip(levels, found, strict=True) if at is not None and c > at]
    better, worse = Verdict.BETTER, Verdict.WORSE
    if kind == Crossing.DOWN:
        return better in below and worse not in below and worse in above and better not in above
    if kind == Crossing.UP:
        return worse in below and better not in below and better in above and worse not in above
    if kind == Crossing.NEVER:
        return better in found and worse not in found
    return all(v == worse for v in found)  # BELOW: lower at every level


def _by_verdicts(b: Arm, levels: list[int], found: list[Verdict], words: tuple[str, str, str],
                 where: str) -> Claim:  # fmt: skip
    """The claim said level by level from the tests, where the crossing's words would say
    more than they found (or every level is the same)."""
    better, worse, figure_name = words
    groups = by_verdict(levels, found)
    up, down = groups.get(Verdict.BETTER, []), groups.get(Verdict.WORSE, [])
    same = groups.get(Verdict.SAME, [])
    if not up and not down:
        return Claim(f"no difference measured in {figure_name} at any level "
                     f"({levels_text(levels)})", significant=False)  # fmt: skip
    said = [f"{better} at {levels_text(up)}"] if up else []
    said += [f"{worse} at {levels_text(down)}"] if down else []
    text = f"{b.label} is " + " and ".join(said)
    if up and down and where:
        text += f" (crossing at {where})"
    if same:
        text += f", no difference measured at {levels_text(same)}"
    return Claim(text, significant=True)


@dataclass(frozen=True)
class FigureWords:
    """How one figure's claim is worded: by verdicts (better, worse, the figure's name)
    where the tests do not bear a crossing out, else by how the sides cross."""

    verdicts: tuple[str, str, str]
    crossing: dict[Crossing, str]


def _figure_claim(
    a: Arm, b: Arm, levels: list[int], key: str, words: FigureWords
) -> tuple[Claim, tuple[Crossing, float | None] | None]:
    """The claim one figure supports, and (for what is added to it) the crossing it
    rests on, its kind and where; None when the claim is by verdicts."""
    found = verdicts(a, b, levels, key)
    if not tested(found) and all(figure(a.levels[c], key) == figure(b.levels[c], key)
                                 for c in levels):  # fmt: skip
        return Claim(f"the same {words.verdicts[2]} at every level "
                     f"({levels_text(levels)})"), None  # fmt: skip
    kind, where = crossover_text(a, b, levels, key)
    at = crossover(levels, *[[level_bound(arm, c, key, 0) for c in levels]
                             for arm in (a, b)])[1]  # fmt: skip
    if tested(found) and not _supported(kind, at, levels, found):
        return _by_verdicts(b, levels, found, words.verdicts, where), None
    return _crossing_claim(kind, where, words.crossing), (kind, at)


def _per_request(a: Arm, b: Arm, levels: list[int]) -> Claim:
    words = FigureWords(("faster per request", "slower per request", "per-request speed"), {
        Crossing.DOWN: f"{b.label} is faster per request up to {{where}}",
        Crossing.UP: f"{b.label} is slower per request below {{where}} and faster from there",
        Crossing.NEVER: f"{b.label} is at least as fast per request at every measured level "
                        f"(C<={levels[-1]})",
        Crossing.BELOW: f"{b.label} is slower per request at every measured level",
    })  # fmt: skip
    claim, crossing = _figure_claim(a, b, levels, PER_REQUEST, words)
    if crossing is None:
        return claim  # said by verdicts: nothing rests on a crossing
    kind, at = crossing
    said = [_decode_basis(a, b, levels, kind, at)]
    said.append(_acceptance_at(b, levels, at) or _acceptance_at(a, levels, at))
    if any(said):
        claim.text += f" ({'; '.join(x for x in said if x)})"
    return claim


def _decode_basis(a: Arm, b: Arm, levels: list[int], kind: Crossing, at: float | None) -> str:
    """Per-request speed is output tokens over the whole request, TTFT included. Where
    decode speed alone (1000 / TPOT) crosses elsewhere, both are said: with a prefill-heavy
    or queueing server they differ (llama.cpp's 40% draft: C~3 end to end, C~8 decoding),
    and each answers a different question. Silent where they agree or TPOT is missing."""
    tpot = [[arm.levels[c].get(catalogue.TPOT) for c in levels] for arm in (a, b)]
    if any(not isinstance(v, int | float) or v <= 0 for side in tpot for v in side):
        return ""
    speeds = [[1000.0 / float(v) for v in side] for side in tpot]
    decode_kind, decode_at = crossover(levels, *speeds)
    found = verdicts(a, b, levels, catalogue.TPOT, higher=False)  # lower TPOT: faster
    if tested(found) and not _supported(decode_kind, decode_at, levels, found):
        return ""  # decoding's tests do not bear a direction out: nothing said of it
    decode_where = f"C~{decode_at:.0f}" if decode_at is not None else ""

    def bracket(c: float | None) -> int:  # the measured levels it falls between
        return -1 if c is None else sum(level < c for level in levels)

    if decode_kind == kind and bracket(decode_at) == bracket(at):
        return ""  # the same crossing, as far as the measured levels can tell
    text = {
        Crossing.DOWN: f"faster up to {decode_where}",
        Crossing.UP: f"slower below {decode_where} and faster from there",
        Crossing.NEVER: "at least as fast at every measured level",
        Crossing.BELOW: "slower at every measured level",
    }[decode_kind]
    return f"end to end, TTFT included; by decode speed alone (1000/TPOT) {b.label} is {text}"


def _total(a: Arm, b: Arm, levels: list[int]) -> Claim:
    words = FigureWords((f"higher in total throughput than {a.label}",
                         f"lower in total throughput than {a.label}", "total throughput"), {
        Crossing.DOWN: f"{b.label} loses total throughput from {{where}}",
        Crossing.UP: f"{b.label} gains total throughput over {a.label} from {{where}}",
        Crossing.NEVER: f"{b.label} keeps total throughput at or above {a.label}'s up to "
                        f"C={levels[-1]}",
        Crossing.BELOW: f"{b.label} has lower total throughput than {a.label} at every level",
    })  # fmt: skip
    return _figure_claim(a, b, levels, TOTAL, words)[0]


def _top(a: Arm, b: Arm, levels: list[int]) -> Claim:
    """At the highest common level: who delivers more, claimed only where it is significant."""
    top = levels[-1]
    ra, rb = a.levels[top], b.levels[top]
    ta, tb = figure(ra, TOTAL), figure(rb, TOTAL)
    if not ta or not tb:
        return Claim(f"at C={top} total throughput is missing on one side", level=top)
    if ta == tb:
        return Claim(f"equal total throughput at C={top}", significant=False, level=top)
    interval = ratio_ci(ra, rb, TOTAL)
    text = ratio_text(ra, rb, TOTAL)
    if interval is not None and interval[0] <= 1.0 <= interval[1]:
        return Claim(f"no significant difference in total throughput at C={top} ({b.label}/"
                     f"{a.label} {text})", significant=False, level=top)  # fmt: skip
    winner, ratio = (a.label, ta / tb) if ta >= tb else (b.label, tb / ta)
    if interval is not None and winner != b.label:
        interval = (1 / interval[1], 1 / interval[0])
    # one decimal alone (`2.2x`); with an interval, two for the three (`1.37x [1.36-1.38]`)
    figure_said = with_interval(ratio, interval, places=2 if interval else 1, suffix="x")
    said = f"at C={top} {winner} delivers {figure_said} the total throughput"
    return Claim(said, significant=None if interval is None else True, level=top)


def _acceptance_at(arm: Arm, levels: list[int], at: float | None) -> str:
    """The arm's per-request acceptance at the measured level nearest the crossover: the
    spread says whether the crossover holds for most requests or only on average."""
    if at is None:
        return ""
    c = min(levels, key=lambda level: abs(math.log(level) - math.log(max(at, 1e-9))))
    row = arm.levels.get(c)
    if row is None:
        return ""
    p50, p10, p90 = (row.get(f"{q}_request_accept_length") for q in ("median", "p10", "p90"))
    if p50 is None:
        return ""
    spread = f", p10-p90 {p10:.2f}-{p90:.2f}" if p10 is not None and p90 is not None else ""
    return f"{arm.label}'s per-request acceptance at C={c}: p50 {p50:.2f} tokens a step{spread}"


def _approximated(a: Arm, b: Arm, levels: list[int]) -> Claim | None:
    """Arms whose token counts are the chunks' (the server gave no consistent count, the
    host no tokenizer): a chunk of k tokens counted as one puts their tok/s and TPOT off
    by k, so a direction may be the counting's, not the servers'."""
    where = []
    for arm in (a, b):
        found = [c for c in levels if "chunks" in str(arm.levels[c].get("output_tokens_source"))]
        if found:
            where.append(f"{arm.label} at C={','.join(map(str, found))}")
    if not where:
        return None
    return Claim(f"but {' and '.join(where)} counted the chunks, not the tokens (an "
                 "approximation): tok/s and TPOT there may be off by the tokens a chunk "
                 "carried")  # fmt: skip


def _energy(a: Arm, b: Arm, levels: list[int]) -> Claim | None:
    """Energy, where it changes the verdict: at a level where one side is faster per
    request and the other gets more tokens per joule, both by their tests (each interval
    excludes 1.0). Point estimates alone say nothing here: without repeats, or where either
    test finds no difference, there is no clause (two identical arms once read "1.11x the
    tokens per joule" beside a 0.90x [0.71-1.14] n.s. in the same report)."""
    for c in levels:
        speed = verdict(a, b, c, PER_REQUEST)
        energy = verdict(a, b, c, catalogue.TOKENS_PER_JOULE)
        decided = (Verdict.BETTER, Verdict.WORSE)
        if speed not in decided or energy not in decided or speed == energy:
            continue
        faster, frugal = (b, a) if speed == Verdict.BETTER else (a, b)
        low, high = ratio_ci(a.levels[c], b.levels[c], catalogue.TOKENS_PER_JOULE) or (1.0, 1.0)
        point = figure(b.levels[c], catalogue.TOKENS_PER_JOULE) or 0.0
        point /= figure(a.levels[c], catalogue.TOKENS_PER_JOULE) or 1.0
        if frugal is a:
            point, low, high = 1 / point, 1 / high, 1 / low
        said = with_interval(point, (low, high), suffix="x")
        return Claim(
            f"but at C={c}, where {faster.label} is faster per request, {frugal.label} "
            f"gets {said} the tokens per joule",
            significant=True,
            level=c,
        )
    return None


def sentence(a: Arm, b: Arm, levels: list[int], found: list[Notice] | None = None) -> str:
    """The answer in one sentence, for two arms (`build`'s, given the same notices)."""
    if not levels:
        return "no common concurrency levels to compare"
    return Answer("", [a.label, b.label], levels, claims(a, b, levels, found or [])).sentence


def to_markdown(
    title: str, answers: list[Answer], tables: dict[str, tuple[list[str], list[list[str]]]]
) -> str:
    """summary.md of a comparison: per host the answer, its errors and warnings, the table."""
    lines = [f"# {title}", ""]
    for answer in answers:
        lines += [
            f"## {answer.host}: {md_cell(' vs '.join(answer.labels))}",
            "",
            *(
                f"**Answer:** {text}" if n == 0 else f"**And:** {text}"
                for n, text in enumerate(answer.sentences)
            ),
            "",
        ]
        lines += [f"- **error:** {n.text}" for n in answer.errors]
        lines += [f"- warning: {n.text}" for n in answer.warnings]
        headers, rows = tables[answer.host]
        lines += ["", *md_table(headers, rows)]
        lines.append("")
    return "\n".join(lines)
