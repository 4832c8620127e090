"""Documentation stays true: every hook is documented; README's test command is .ci/run's; the ledger keeps its
four dimensions and its lever ledger; every document cites only results that exist, now or at the commit it names."""

from __future__ import annotations

import fnmatch
import functools
import inspect
import re
import subprocess
from pathlib import Path

from dohnuts.bench import hookspecs

ROOT = Path(__file__).resolve().parents[1]


def _hooks():
    return [name for name, fn in vars(hookspecs).items()
            if name.startswith("dohnuts_bench_") and inspect.isfunction(fn)]


def test_every_hook_has_a_docstring_and_a_row_in_the_plugin_guide():
    guide = (ROOT / "docs" / "plugins.md").read_text()
    hooks = _hooks()
    assert len(hooks) >= 8
    for name in hooks:
        assert (getattr(hookspecs, name).__doc__ or "").strip(), f"{name} has no docstring"
        assert f"`{name}(" in guide, f"{name} is missing from docs/plugins.md"


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = next(line for line in ci.splitlines() if "pytest" in line and not line.startswith("#")).strip()
    assert command in readme
    assert re.search(r"pip install .*-e '\.\[test\]'", command)


# -- the plugin contracts and docs/plugins.md ---------------------------------------------------------

FENCE = re.compile(r"```.*?```", re.S)
SPAN = re.compile(r"`([^`\n]+)`")
CLASS_NAME = re.compile(r"(?<![.\w])([A-Z][a-z][A-Za-z0-9]*)")
DOTTED = re.compile(r"\b(dohnuts(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def _contracts():
    from dohnuts.bench import contracts

    return contracts


def _params(fn) -> str:
    """`a, b, *, c` of a protocol method (self left out)."""
    out, star = [], False
    for p in list(inspect.signature(fn).parameters.values())[1:]:
        if p.kind is p.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        out.append(p.name)
    return ", ".join(out)


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of every `###` section."""
    parts = re.split(r"^(#{2,3} .*)$", text, flags=re.M)
    return [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2) if parts[i].startswith("### ")]


def _member_rows(body: str) -> list[tuple[str, str | None, str]]:
    """(member, its parameters or None, required/optional) of each row of a section's member tables."""
    rows = []
    for line in body.splitlines():
        m = re.match(r"\|\s*`([A-Za-z_]\w*)(?:\(([^)]*)\))?`\s*\|\s*(required|optional)", line)
        if m:
            rows.append((m.group(1), m.group(2), m.group(3)))
    return rows


def test_the_plugin_guide_documents_every_member_of_every_contract():
    """Each contract of dohnuts.bench.contracts has a section of docs/plugins.md whose member tables
    list exactly its required members (methods with their parameters) and its optional members."""
    import dataclasses

    contracts = _contracts()
    guide = (ROOT / "docs" / "plugins.md").read_text()
    seen = set()
    for heading, body in _sections(guide):
        named = [contracts.__dict__[n] for n in SPAN.findall(heading) if n in contracts.__dict__
                 and contracts.__dict__[n] in contracts.CONTRACTS]
        if not named:
            continue
        seen.update(named)
        required = {m: proto for proto in named for m in contracts.protocol_members(proto)}
        optional = {f.name for proto in named if contracts.CONTRACTS[proto]
                    for f in dataclasses.fields(contracts.CONTRACTS[proto])}
        rows = _member_rows(body)
        assert {m for m, _, how in rows if how == "required"} == set(required), heading
        assert {m for m, _, how in rows if how == "optional"} == optional, heading
        for member, params, how in rows:
            fn = required.get(member) and required[member].__dict__.get(member)
            if how == "required" and callable(fn):
                assert params == _params(fn), f"{heading}: `{member}({params})` but the contract has ({_params(fn)})"
    assert seen == set(contracts.CONTRACTS), f"no section for {set(contracts.CONTRACTS) - seen}"


def _known_names() -> dict:
    import builtins
    import importlib

    names = dict(vars(builtins))
    for module in ("dohnuts.bench.contracts", "dohnuts.bench.calls", "dohnuts.bench.sections", "dohnuts.bench.sink",
                   "dohnuts.bench.measure.telemetry", "dohnuts.bench.measure.workload", "dohnuts.bench.plugins", "dohnuts.errors",
                   "dohnuts.runtime.timing", "dohnuts.runtime.predict", "dohnuts.runtime.work"):
        names.update(vars(importlib.import_module(module)))
    contracts = _contracts()
    for proto, caps in contracts.CONTRACTS.items():  # a member may be named alone (`Options`)
        names.update(dict.fromkeys(contracts.protocol_members(proto)))
        names.update(dict.fromkeys(f.name for f in (__import__("dataclasses").fields(caps) if caps else ())))
    return names


def _resolves(dotted: str) -> bool:
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _undefined_names(text: str) -> list[str]:
    """The classes and dotted paths a text names in backticks (code blocks left out) that do not exist."""
    known = _known_names()
    bad = []
    for span in SPAN.findall(FENCE.sub("", text)):
        for dotted in DOTTED.findall(span):
            if not _resolves(dotted):
                bad.append(dotted)
        for name in CLASS_NAME.findall(DOTTED.sub("", span)):
            if name not in known:
                bad.append(name)
    return bad


def test_the_plugin_guide_and_the_hookspecs_name_only_what_exists():
    """Every class and dotted path docs/plugins.md and the hook docstrings name exists (the guide
    once named a `WorkloadKind` and a `dohnuts.bench.target.Target` that did not)."""
    assert not _undefined_names((ROOT / "docs" / "plugins.md").read_text())
    for name in _hooks():
        assert not _undefined_names(getattr(hookspecs, name).__doc__), name
    assert not _undefined_names(hookspecs.__doc__)


def test_the_name_check_can_fail():
    assert _undefined_names("a `WorkloadKindz` and `dohnuts.bench.target.Target`, not `WorkloadKind`") == [
        "WorkloadKindz", "dohnuts.bench.target.Target"]


def test_the_documented_factory_arity_is_the_contracts():
    """The target factory is documented, in the guide and in its hook, with the parameters the
    contract and the runner use: (spec, device, dtype, options)."""
    contracts = _contracts()
    params = _params(contracts.TargetFactory.__call__)
    assert params == "spec, device, dtype, options"
    assert f"factory({params})" in (ROOT / "docs" / "plugins.md").read_text()
    assert f"factory({params})" in hookspecs.dohnuts_bench_register_targets.__doc__


# -- the ledger (docs/history/evolution.md) and the known issues ---------------------------------------

HISTORY = ROOT / "docs" / "history"
DIMENSIONS = ["algorithm", "model architecture", "infra", "dataset"]
LEVER_STATUSES = ("fixed", "closed by measurement", "to do")
KI_HEADING = re.compile(r"^## KI-(\d+)\b", re.M)


def _tables(text: str) -> list[list[list[str]]]:
    """Each markdown table of a text as rows of stripped cells, the header first (separator left out)."""
    tables, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            if not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line.strip()):
                rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def _section(text: str, heading: str) -> str:
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    return m.group(1) if m else ""


def ledger_problems(text: str, open_kis: set[int], older_kis: set[int]) -> list[str]:
    """What keeps a ledger from the sibling log's shape: every milestone (M1, M2, ... in order) opens
    with a table of the four dimensions (algorithm, model architecture, infra, dataset: each row a
    change and a measured result, none empty) and has no second one; before M1, the cumulative view
    names every dimension, and the lever ledger gives each lever a status (fixed, closed by
    measurement, to do; each used) and the milestone or KI that holds it — a milestone of the
    ledger, an open KI, or a KI of the history file when it says "history"."""
    problems = []
    parts = re.split(r"^## (M\d+)\b.*$", text, flags=re.M)
    head, entries = parts[0], list(zip(parts[1::2], parts[2::2]))
    names = [m for m, _ in entries]
    if not names or names != [f"M{i}" for i in range(1, len(names) + 1)]:
        problems.append(f"milestones not M1 ... Mn in order: {names}")
    for m, body in entries:
        tables = _tables(body)
        if not tables or tables[0][0] != ["dimension", "change", "measured"]:
            problems.append(f"{m}: does not open with its four dimensions")
            continue
        rows = tables[0][1:]
        if [r[0] for r in rows] != DIMENSIONS:
            problems.append(f"{m}: dimensions {[r[0] for r in rows]}")
        if any(len(r) != 3 or not all(r) for r in rows):
            problems.append(f"{m}: a dimension without its change or result")
        if any(t[0][0] == "dimension" for t in tables[1:]):
            problems.append(f"{m}: a second table of dimensions (details are by part)")
    view = _section(head, "Where each dimension stands")
    for d in DIMENSIONS:
        if f"**{d.capitalize()}.**" not in view:
            problems.append(f"the cumulative view has no {d}")
    levers = [t for t in _tables(_section(head, "Lever ledger")) if t[0] == ["lever", "status", "measured", "where"]]
    if len(levers) != 1:
        return problems + ["no lever ledger"]
    statuses = set()
    for lever, status, measured, where in (r + [""] * (4 - len(r)) for r in levers[0][1:]):
        statuses.add(status)
        if status not in LEVER_STATUSES:
            problems.append(f"lever '{lever}': status {status!r}")
        if not measured:
            problems.append(f"lever '{lever}': nothing measured or known")
        cited = re.findall(r"(history )?(M|KI-)(\d+)", where)
        if not cited:
            problems.append(f"lever '{lever}': held by no milestone or KI")
        for history, kind, n in cited:
            known = names if kind == "M" else (open_kis | older_kis) if history else open_kis
            if (f"M{n}" if kind == "M" else int(n)) not in known:
                problems.append(f"lever '{lever}': {kind}{n} is not {'in the ledger' if kind == 'M' else 'a KI there'}")
    if statuses != set(LEVER_STATUSES):
        problems.append(f"lever statuses used: {sorted(statuses)}")
    return problems


def _kis(path: Path) -> set[int]:
    return {int(n) for n in KI_HEADING.findall(path.read_text())}


def test_the_ledger_gives_every_milestone_its_four_dimensions_a_cumulative_view_and_a_lever_ledger():
    text = (HISTORY / "evolution.md").read_text()
    open_kis, older = _kis(ROOT / "docs" / "known-issues.md"), _kis(HISTORY / "known-issues-2026-12-01.md")
    assert ledger_problems(text, open_kis, older) == []


def test_the_ledger_check_can_fail():
    good = (HISTORY / "evolution.md").read_text()
    open_kis, older = _kis(ROOT / "docs" / "known-issues.md"), _kis(HISTORY / "known-issues-2026-12-01.md")
    dataset_row = re.search(r"^\| dataset \|.*\n", good[good.index("## M1 "):], flags=re.M).group(0)
    cases = {
        "M1: dimensions": good.replace(dataset_row, "", 1),
        "lever 'CUDA graphs": good.replace("| CUDA graphs of every pass and of training's microbatches | fixed |",
                                           "| CUDA graphs of every pass and of training's microbatches | maybe |"),
        "is not in the ledger": good.replace("| M8 (history KI-2) |", "| M99 |", 1),
        "is not a KI there": good.replace("| KI-16 |", "| KI-3 |", 1),  # KI-3 is closed: the history file holds it
        "the cumulative view has no dataset": good.replace("**Dataset.**", "**Data.**"),
        "a second table of dimensions": good.replace("| part | change |", "| dimension | change |", 1),
    }
    for expected, text in cases.items():
        assert text != good, expected
        assert any(expected in p for p in ledger_problems(text, open_kis, older)), expected


# A results path: a glob may hold `*` and `{a,b}`; a path wrapped after a slash counts whole.
RESULTS_PATH = re.compile(r"results/(?:[\w.*-]|\{[\w.,-]*\}|/(?:\n[ \t]*(?=[\w{]))?)*")
# "`results/h200/x` at commit d37d1f2": the path as it stood in git, named after the path or after the
# code span that holds it
AT_COMMIT = re.compile(r"\s+at\s+commit\s+([0-9a-f]{7,40})\b")
SPAN_REST = re.compile(r"[^`]*`")  # a code span may go on past a line break


def _expanded(path: str) -> list[str]:
    """`results/b/h200-2b-{1,2}.json` → its two paths."""
    m = re.search(r"\{([^}]*)\}", path)
    if not m:
        return [path]
    return [p for alt in m.group(1).split(",") for p in _expanded(path[:m.start()] + alt + path[m.end():])]


def cited_results(text: str) -> list[tuple[str, str | None]]:
    """Each `results/...` path a text names, with the commit it is cited at (None: the working tree);
    paths with placeholders (`results/baselines/<machine>/`) left out."""
    cited = []
    for m in RESULTS_PATH.finditer(text):
        raw = m.group(0)
        path = re.sub(r"\n[ \t]*", "", raw).rstrip(".")
        if text[m.end():m.end() + 1] == "<":
            continue
        end = m.start() + len(raw.rstrip("."))
        if text[text.rfind("\n", 0, m.start()) + 1:m.start()].count("`") % 2:  # inside a code span
            rest = SPAN_REST.match(text, end)
            end = rest.end() if rest else end  # an unclosed span: the path's own end
        at = AT_COMMIT.match(text, end)
        cited.extend((p, at and at.group(1)) for p in _expanded(path))
    return cited


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


@functools.cache
def _tree(commit: str) -> frozenset[str] | None:
    """Every file and folder of `commit` (None where this clone does not hold it: a shallow clone)."""
    files = _git("ls-tree", "-r", "--name-only", commit)
    if files.returncode:
        assert _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true", f"no commit {commit}"
        return None
    names = set(files.stdout.splitlines())
    return frozenset(names | {str(Path(n).parents[i]) for n in names for i in range(len(Path(n).parents) - 1)})


def _held(path: str, commit: str | None) -> bool:
    path = path.rstrip("/")
    if commit is None:
        return any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()
    tree = _tree(commit)
    if tree is None:  # a shallow clone: the citation is accepted by its form
        return True
    return any(fnmatch.fnmatchcase(n, path) for n in tree) if "*" in path else path in tree


def missing_results(text: str) -> list[str]:
    """The results paths a text cites that do not exist: in the working tree, or, for a path cited
    "at commit X", in git at X (`git ls-tree`)."""
    return [path + (f" at commit {commit}" if commit else "") for path, commit in cited_results(text)
            if not _held(path, commit)]


def _markdown_files() -> list[Path]:
    return [ROOT / p for p in _git("ls-files", "--", "*.md").stdout.splitlines()]


def test_every_document_cites_only_results_that_exist_now_or_at_the_commit_it_names():
    """docs/measurement.md once cited the removed `cpu-tiny-*` baselines; results/ since keeps
    reference runs only, and a document that cites a removed run names the commit that holds it
    ("`results/h200/2026-12-01-s11` at commit d37d1f2"): every results path of every tracked
    Markdown file — the README, docs/ and the ledger, the READMEs of results/, benchmarks/ and the
    fixtures — exists, in the working tree or at that commit."""
    docs = _markdown_files()
    assert {"README.md", "docs/history/evolution.md", "results/README.md"} <= {str(d.relative_to(ROOT)) for d in docs}
    for doc in docs:
        assert missing_results(doc.read_text(encoding="utf-8")) == [], doc.relative_to(ROOT)


def test_the_results_check_can_fail():
    assert missing_results("the baselines `results/baselines/cpu-tiny-*.json` and `results/h200/\n"
                           "  2026-12-04-s20-images`") == ["results/baselines/cpu-tiny-*.json"]
    assert missing_results("`results/h200/2026-12-01-s11/ab-after`, removed") == [
        "results/h200/2026-12-01-s11/ab-after"]
    assert missing_results("(`dohnuts-bench analyze results/h200/no-such\n--out DIR`), and `results/h200/unclosed") == [
        "results/h200/no-such", "results/h200/unclosed"]  # a span past a line break, a span never closed
    if _tree("d37d1f2") is not None:  # a full clone: the commit's tree is read
        assert missing_results("`results/h200/2026-12-01-s11/ab-after` at commit d37d1f2") == []
        assert missing_results("`dohnuts-bench analyze results/h200/2026-12-01-s11/ab-after --out x` at commit "
                               "d37d1f2, and results/h200/no-such at commit d37d1f2.") == [
            "results/h200/no-such at commit d37d1f2"]
        assert missing_results("`results/baselines/h200-2b-{1,2,9}.json` at commit d37d1f2") == [
            "results/baselines/h200-2b-9.json at commit d37d1f2"]
        assert missing_results("`results/h200/2026-11-30-kernels*` at commit d37d1f2") == []
