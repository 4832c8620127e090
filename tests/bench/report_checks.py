"""Reading a run's report files back the way a person reads them, for the tests: the tables of
report.txt (rich box tables) and report.html, cell by cell under their column headers, and every
efficiency summary.json holds.

`impossible_figures(run_dir)` lists every efficiency above 100 % shown as a number in report.txt,
report.html or summary.json, where it is — empty when the rule "no impossible figure" holds. A
percentage above 100 % is allowed only in a column that holds no efficiency (`NOT_EFFICIENCY`:
a spread, the spread warning of the quality table, the harness overhead's interval).
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

PERCENT = re.compile(r"(?<![\w.])(-?\d+(?:,\d{3})*(?:\.\d+)?)\s?%")
# columns whose percentages are not efficiencies (and may pass 100 %)
NOT_EFFICIENCY = ("spread", "note", "harness overhead", "noise", "of ceiling", "share of wall")


def percents(text: str) -> list[float]:
    return [float(m.replace(",", "")) for m in PERCENT.findall(text)]


# -- report.txt -----------------------------------------------------------------------------------

def text_tables(text: str) -> list[dict]:
    """Every rich box table of `text`: {"title", "start", "end" (line indices), "headers", "rows"}
    with cells split at the column rules; a header is its lines joined."""
    lines = text.splitlines()
    tables, i = [], 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("┏"):
            i += 1
            continue
        start, title = i, lines[i - 1].strip() if i else ""
        heads: list[list[str]] = []
        rows: list[list[str]] = []
        i += 1
        while i < len(lines) and not lines[i].lstrip().startswith("└"):
            line = lines[i].strip()
            if line.startswith("┃"):
                heads.append([c.strip() for c in line.strip("┃").split("┃")])
            elif line.startswith("│"):
                rows.append([c.strip() for c in line.strip("│").split("│")])
            i += 1
        headers = [" ".join(h[k] for h in heads if k < len(h)).strip() for k in range(max(map(len, heads), default=0))]
        tables.append({"title": title, "start": start, "end": i, "headers": headers, "rows": rows})
        i += 1
    return tables


def _text_problems(text: str) -> list[str]:
    out = []
    in_table = set()
    lines = text.splitlines()
    for t in text_tables(text):
        in_table.update(range(t["start"], t["end"] + 1))
        for row in t["rows"]:
            label = row[0].lower() if row else ""
            for header, cell in zip(t["headers"], row):
                over = [p for p in percents(cell) if p > 100.0]
                if not over:
                    continue
                efficiency = "eff" in header.lower() or "efficien" in label
                if efficiency or not any(n in header.lower() for n in NOT_EFFICIENCY):
                    out.append(f"report.txt, table {t['title']!r}, column {header!r}: {cell!r}")
    for k, line in enumerate(lines):
        if k in in_table or line.lstrip()[:1] in "┏┃┡│└":
            continue
        if any(p > 100.0 for p in percents(line)) and re.search(r"effic|bound", line, re.I):
            out.append(f"report.txt, line {k + 1}: {line.strip()[:160]!r}")
    return out


# -- report.html ----------------------------------------------------------------------------------

class HtmlCells(HTMLParser):
    """(table id, column header, cell text) of every <td>; texts outside tables; the ids of the
    tables in page order; and every element's data-key with its text."""

    def __init__(self):
        super().__init__()
        self.cells: list[tuple[str, str, str]] = []
        self.loose: list[str] = []
        self.table_ids: list[str] = []
        self.keyed: list[list[str]] = []
        self._tables: list[dict] = []
        self._cell: list[str] | None = None
        self._open: list[list[str] | None] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self.table_ids.append(a.get("id") or a.get("class") or "")
            self._tables.append({"id": self.table_ids[-1], "headers": [], "col": 0, "in_head": False})
        elif tag == "tr" and self._tables:
            self._tables[-1]["col"] = 0
        elif tag in ("th", "td") and self._tables:
            self._cell = [tag, ""]
        if tag in ("td", "b", "span", "th"):
            item = [a["data-key"], a.get("data-group", ""), ""] if "data-key" in a else None
            self._open.append(item)
            if item:
                self.keyed.append(item)

    def handle_endtag(self, tag):
        if tag in ("td", "b", "span", "th") and self._open:
            self._open.pop()
        if tag in ("th", "td") and self._tables and self._cell is not None:
            t = self._tables[-1]
            kind, text = self._cell
            if kind == "th":
                t["headers"].append(text.strip())
            else:
                header = t["headers"][t["col"]] if t["col"] < len(t["headers"]) else ""
                self.cells.append((t["id"], header, text.strip()))
            t["col"] += 1
            self._cell = None
        elif tag == "table" and self._tables:
            self._tables.pop()

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1] += data
        elif not self._tables:
            self.loose.append(data)
        for item in self._open:
            if item is not None:
                item[2] += data


def html_cells(html: str) -> HtmlCells:
    page = HtmlCells()
    page.feed(html)
    return page


def _html_problems(html: str) -> list[str]:
    page = html_cells(html)
    out = []
    for table, header, text in page.cells:
        over = [p for p in percents(text) if p > 100.0]
        if over and ("efficien" in header.lower() or not any(n in header.lower() for n in NOT_EFFICIENCY)):
            out.append(f"report.html, table {table!r}, column {header!r}: {text!r}")
    for key, group, text in page.keyed:
        if "efficiency" in key and any(p > 100.0 for p in percents(text)):
            out.append(f"report.html, {key} of {group}: {text!r}")
    for text in page.loose:
        if any(p > 100.0 for p in percents(text)) and re.search(r"effic|bound", text, re.I):
            out.append(f"report.html, text: {text.strip()[:160]!r}")
    return out


# -- summary.json ---------------------------------------------------------------------------------

def _json_problems(summary: dict) -> list[str]:
    """Every number under an `efficiency` key (the analysis' stage and call efficiencies per
    basis, the headline's) must be at most 1 (the section named "efficiency" is no such key)."""
    out = []
    stack = [(summary, "", False)]
    while stack:
        x, at, under = stack.pop()
        if isinstance(x, dict):
            stack += [(v, f"{at}.{k}", under or (str(k).endswith("efficiency") and at != ".sections"))
                      for k, v in x.items()]
        elif isinstance(x, list):
            stack += [(v, f"{at}[{i}]", under) for i, v in enumerate(x)]
        elif under and isinstance(x, (int, float)) and not isinstance(x, bool) and x > 1.0:
            out.append(f"summary.json{at}: {x}")
    return out


def impossible_figures(run_dir: Path) -> list[str]:
    """Every efficiency above 100 % shown as a number in the run's report.txt, report.html and
    summary.json (each file must exist)."""
    run_dir = Path(run_dir)
    return (_text_problems((run_dir / "report.txt").read_text())
            + _html_problems((run_dir / "report.html").read_text())
            + _json_problems(json.loads((run_dir / "summary.json").read_text())))
