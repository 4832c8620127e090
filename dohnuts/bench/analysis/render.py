"""Reports of an Analysis: rich terminal tables.

Tables: per workload and target, one row per stage (measured, bound, efficiency, limiter,
target verdict, useful / padded / repeated GFLOP), then the call summary (sum, max, critical
path and latency of bounds and of measurements, wall time, whole-call efficiency, decisions/s).
The roofline plot is dohnuts.bench.analysis.roofline's (the PNG and the HTML page's panels, one
drawing).

Layout rule (`FitTable`, also used by the built-in reporter): a table chooses its layout when
it is printed, from the width it is given (the console's width; `report.txt` is written at the
widest table's natural width, so it always holds the full tables). No cell is ever cut: every
column is wide enough for its longest word, numbers never contain a space and therefore never
wrap, and columns overflow by folding, never with "…". Only text columns (names, labels,
limiters, stage sequences) may wrap, at spaces. In order:

1. full — every column side by side, exactly the wide table, when the numeric columns at their
   natural width plus the text columns at their longest word fit the width (the slack widens
   the text columns up to their natural width, value columns before names and labels);
2. split — otherwise the key columns (the stage, the quantity, the target) are repeated and the
   value columns, in their wide order and keeping groups together (a bound with its efficiency,
   a p10–p90 with its median), are packed into as many narrower tables as needed, each fitting
   the width; leading name columns marked as sections (workload, workload · target) become a
   heading line above their rows instead of a column;
3. stacked — when even one key column and one group do not fit: one block per row, its key on a
   line, then "header value" items packed onto lines of the width.

Every cell of the full table appears in every layout (on more lines), so a narrow console
shows every number the wide report shows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby

from rich.console import Console, ConsoleOptions, RenderableType
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from dohnuts.bench.analysis.report import Analysis, GroupAnalysis
from dohnuts.bench.report.terminal import SafeConsole
from dohnuts.schema import printable

UNBOUNDED = 100_000  # the width a table is measured at to get its natural width


def _cell_text(cell: str | Text) -> Text:
    """A cell as Text, its control characters written as escapes (a Text's style kept)."""
    if not isinstance(cell, Text):
        return Text(printable(cell))
    if cell.plain.isprintable():
        return cell
    return Text(printable(cell.plain), style=cell.style)


@dataclass(frozen=True)
class Col:
    """One column of a FitTable. `header` breaks lines only where it says "\\n"; `wrap`: its
    cells may wrap at spaces (names, labels); otherwise they never wrap (numbers)."""

    header: str
    justify: str = "right"
    wrap: bool = False


class FitTable:
    """A rich renderable table that picks its layout (full, split, stacked: see the module
    docstring) from the width it is rendered at; it measures at the full table's natural width.

    Columns, in the full table's order: `sections` leading name columns (a heading in the narrow
    layouts), then `keys` key columns (repeated in every part of a split), then the value
    columns; `groups` lists tuples of value-column indices kept together (default: each alone).
    Cells are plain strings or `rich.text.Text` (for colour); strings are never read as markup, and
    a cell's control characters are written as escapes (dohnuts.schema.printable) before it is
    measured, so a hostile name keeps the table's columns aligned.
    """

    def __init__(self, title: str, columns: Sequence[Col], *, keys: int = 1, sections: int = 0,
                 groups: Sequence[Sequence[int]] | None = None, title_justify: str = "left"):
        self.title, self.columns, self.keys, self.sections = title, list(columns), keys, sections
        self.title_justify = title_justify
        values = list(range(sections + keys, len(self.columns)))
        self.groups = [tuple(g) for g in groups] if groups else [(i,) for i in values]
        if sorted(i for g in self.groups for i in g) != values:
            raise ValueError(f"groups {self.groups} must cover the value columns {values} once each")
        self.rows: list[list[Text]] = []

    def add_row(self, *cells: str | Text) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append([_cell_text(c) for c in cells])

    # -- measuring -------------------------------------------------------------------------
    def _extents(self, console: Console, options: ConsoleOptions) -> list[tuple[int, int]]:
        """Per column: (longest word, longest line) over its header and cells."""
        opts = options.update_width(UNBOUNDED)
        out = []
        for i, col in enumerate(self.columns):
            ms = [Measurement.get(console, opts, c) for c in [Text(col.header)] + [r[i] for r in self.rows]]
            out.append((max(1, max(m.minimum for m in ms)), max(1, max(m.maximum for m in ms))))
        return out

    def _widths(self, idx: Sequence[int], ext: list[tuple[int, int]], width: int) -> list[int] | None:
        """Content widths of columns `idx` in a table at most `width` wide, or None if it cannot
        fit without cutting a word: value columns at their natural width, text columns at least
        their longest word, the slack shared out among text columns up to their natural width."""
        alloc = {i: ext[i][0] if self.columns[i].wrap else ext[i][1] for i in idx}
        slack = width - sum(alloc.values()) - (3 * len(idx) + 1)  # padding 1+1, borders n+1
        if slack < 0:
            return None
        first = self.sections + self.keys  # value columns first (split values read worse than labels)
        for tier in ([i for i in idx if i >= first], [i for i in idx if i < first]):
            while slack > 0:
                short = [i for i in tier if self.columns[i].wrap and alloc[i] < ext[i][1]]
                if not short:
                    break
                for i in short[:slack]:
                    alloc[i] += 1
                slack -= min(slack, len(short))
        return [alloc[i] for i in idx]

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        ext = self._extents(console, options)
        natural = sum(e[1] for e in ext) + 3 * len(ext) + 1
        return Measurement(min(natural, max(e[0] for e in ext) + 2), natural)

    # -- rendering -------------------------------------------------------------------------
    def _table(self, idx: Sequence[int], widths: Sequence[int], rows: list[list[Text]],
               title: str | None = None) -> Table:
        # the title and headers as Text: a path in a title (compare's `A = RUN`) is never markup
        t = Table(title=None if title is None else _cell_text(title), title_justify=self.title_justify,
                  title_style="table.title")
        for i, w in zip(idx, widths):
            c = self.columns[i]
            t.add_column(Text(c.header), justify=c.justify, width=w, no_wrap=not c.wrap, overflow="fold")
        for r in rows:
            t.add_row(*(r[i] for i in idx))
        return t

    def _sectioned(self) -> list[tuple[str | None, list[list[Text]]]]:
        if not self.sections:
            return [(None, self.rows)]
        key = lambda r: tuple(c.plain for c in r[: self.sections])
        return [(" · ".join(k), list(rows)) for k, rows in groupby(self.rows, key=key)]

    def _parts(self, keys: list[int], ext, width: int) -> list[tuple[list[int], list[int]]] | None:
        """Greedy packing of the value groups into tables that each fit `width`."""
        parts: list[list[int]] = []
        current: list[int] = []
        for g in self.groups:
            if self._widths(keys + current + list(g), ext, width) is not None:
                current += g
                continue
            if not current or self._widths(keys + list(g), ext, width) is None:
                return None
            parts.append(current)
            current = list(g)
        parts.append(current)
        return [(keys + p, self._widths(keys + p, ext, width)) for p in parts]

    def _stacked(self, keys: list[int], width: int) -> Iterator[RenderableType]:
        """One block per row: its key cells, then "header value" items, a group's items together,
        packed onto indented lines of at most `width` (an item longer than that wraps at spaces)."""
        sep = Text(" · ", style="dim")
        for heading, rows in self._sectioned():
            if heading is not None:
                yield Text(heading, style="bold", overflow="fold")
            for r in rows:
                key = Text(" · ", overflow="fold").join(r[i] for i in keys)
                key.stylize("bold")
                yield key
                lines: list[Text] = []
                for g in self.groups:
                    items = [Text.assemble((" ".join(self.columns[i].header.split()) + " ", "dim"), r[i])
                             for i in g if r[i].plain.strip()]
                    if not items:
                        continue
                    chunk = sep.join(items)  # a group wider than the line goes item by item
                    for unit in [chunk] if chunk.cell_len <= width - 2 else items:
                        if lines and lines[-1].cell_len + len(sep) + unit.cell_len <= width - 2:
                            lines[-1].append_text(sep).append_text(unit)
                        else:
                            lines.append(unit)
                for line in lines:
                    line.overflow = "fold"
                    yield Padding(line, (0, 0, 0, 2), expand=False)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[RenderableType]:
        width = options.max_width
        ext = self._extents(console, options)
        every = list(range(len(self.columns)))
        full = self._widths(every, ext, width)
        if full is not None:
            yield self._table(every, full, self.rows, self.title)
            return
        yield Text(self.title, style="table.title", overflow="fold")
        keys = list(range(self.sections, self.sections + self.keys))
        parts = self._parts(keys, ext, width)
        if parts is None:
            yield from self._stacked(keys, width)
            return
        for heading, rows in self._sectioned():
            if heading is not None:
                yield Text(heading, style="bold", overflow="fold")
            for idx, widths in parts:
                yield self._table(idx, widths, rows)


def _ms(x: float | None) -> str:
    if x is None:
        return "—"
    if 0 < x < 0.01:  # transfers of a few bytes: keep the digits visible
        return f"{x:.2e}"
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


VERDICT_STYLE = {"meets": "green", "misses": "red", "bound-suspect": "yellow"}


def efficiency_cell(value: float | None, suspect: str | None = None) -> Text:
    """An efficiency as a report shows it: a percentage up to 100 %, or "bound-suspect" where the
    measurement beat its bound (`suspect` holds why; the analysis warnings say it in words)."""
    return Text("bound-suspect", style=VERDICT_STYLE["bound-suspect"]) if suspect else Text(_pct(value))


def _verdict(x: str | None) -> Text:
    """A target verdict (bounds.target_verdict); "bound-suspect": faster than its bound, no verdict."""
    return Text("—") if x is None else Text(x, style=VERDICT_STYLE.get(x, ""))


def _gflop(x: float) -> str:
    return f"{x / 1e9:.3g}" if x else "0"


def stage_table(g: GroupAnalysis, target_fraction: float = 0.8) -> FitTable:
    """Per stage: measured, bound and efficiency for each basis, limiter, verdict, work split.
    Narrow split: stage | measured | bound, eff per basis …, then stage | limiter | verdict | GFLOP."""
    cols = [Col("stage", "left", wrap=True), Col("measured\nms")]
    for b in g.bases:
        cols += [Col(f"bound ms\n{b}"), Col(f"eff\n{b}")]
    first = g.bases[0]  # the datasheet, or the measured ceilings where no datasheet spec applies
    cols += [Col(f"limiter\n({first})", "left", wrap=True), Col(f"{target_fraction:.0%}\ntarget", "center"),
             Col("GFLOP\nuseful"), Col("GFLOP\npadded"), Col("GFLOP\nrepeated")]
    n = len(cols)
    groups = [(1,)] + [(2 + 2 * k, 3 + 2 * k) for k in range(len(g.bases))] + [(n - 5,), (n - 4,), (n - 3, n - 2, n - 1)]
    t = FitTable(f"{g.workload} · {g.target} · {g.precision} · {g.model} · {g.device} ({g.calls} calls)", cols,
                 groups=groups)
    for r in g.stages:
        cells: list[str | Text] = [r.stage, _ms(r.measured_ms)]
        for b in g.bases:
            cells += [_ms(r.bound_ms[b]) if r.modelled else (r.unbounded or "no model"),
                      efficiency_cell(r.efficiency[b], r.suspect.get(b))]
        cells += [r.limiter[first], _verdict(r.verdict[first]),
                  _gflop(sum(r.useful_flops.values())), _gflop(r.padded_flops), _gflop(r.repeated_flops)]
        t.add_row(*cells)
    return t


def call_table(g: GroupAnalysis) -> FitTable:
    """The whole call: combinations of stage times, wall time, efficiency, throughput, work split.
    Every column is text that may wrap at spaces (critical cycles, "a / b / c" splits); the
    numbers themselves have no space and never wrap."""
    cols = [Col("quantity", "left", wrap=True)] + [Col(f"bound\n{b}", wrap=True) for b in g.bases]
    t = FitTable(f"{g.workload} · {g.target}: whole call", cols + [Col("measured", wrap=True)])
    c = g.call
    for label, attr in (("sum of stages ms (no overlap)", "sum_ms"), ("max stage ms (ideal overlap)", "max_ms"),
                        ("critical path ms (pipelined)", "critical_ms"), ("single-call latency ms", "latency_ms")):
        t.add_row(label, *[_ms(getattr(c.bound[b], attr)) for b in g.bases], _ms(getattr(c.measured, attr)))
    t.add_row("wall ms", *["" for _ in g.bases], _ms(c.wall_ms))
    t.add_row("efficiency (critical-path bound / wall)",
              *[efficiency_cell(c.efficiency[b], c.suspect.get(b)) for b in g.bases], "")
    t.add_row("target verdict", *[_verdict(c.verdict[b]) for b in g.bases], "")
    t.add_row("decisions / s", *[f"{c.ceiling_decisions_per_s[b]:.1f}" if c.ceiling_decisions_per_s[b] else "—"
                                 for b in g.bases], f"{c.decisions_per_s:.1f}" if c.decisions_per_s else "—")
    t.add_row("critical cycle", *[" → ".join(c.bound[b].critical_stages) for b in g.bases],
              " → ".join(c.measured.critical_stages))
    tok = c.tokens
    t.add_row("tokens useful / padded / repeated / recomputed", *["" for _ in g.bases],
              f"{tok['useful']:.0f} / {tok['padded']:.0f} / {tok['repeated']:.0f} / {tok['recomputed']:.0f}")
    t.add_row("GFLOP useful / padded / repeated", *["" for _ in g.bases],
              " / ".join(_gflop(c.flops[k]) for k in ("useful", "padded", "repeated")))
    return t


def analysis_tables(analysis: Analysis) -> list[FitTable]:
    """Per group, its stage table and its whole-call table (FitTables: they fit any width)."""
    out = []
    for g in analysis.groups:
        out += [stage_table(g, analysis.hwspec.target_fraction), call_table(g)]
    return out


def print_analysis(analysis: Analysis, console: Console | None = None) -> None:
    """Print every group's tables, then the warnings."""
    console = console or SafeConsole()
    spec = analysis.hwspec
    console.print(Text.assemble((spec.name, "bold"), f" ({spec.source or 'built in'}); target "
                                f"{spec.target_fraction:.0%}"))
    for table in analysis_tables(analysis):
        console.print(table)
    for w in analysis.warnings:
        console.print(Text.assemble(("warning:", "yellow"), f" {w}"))
