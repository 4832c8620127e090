"""Report sections: what analyzers hand to reporters (a title, a rich renderable, plain data).

A section that `leads` (the headline: dohnuts.bench.analysis.headline) opens the report, before
the reporter's own tables; the others follow them in the order the analyzers gave them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Section:
    title: str
    renderable: Any  # anything rich can print (Table, Text, Group)
    data: dict = field(default_factory=dict)  # the same content as plain JSON-able data
    files: list = field(default_factory=list)  # paths written (plots)
    leads: bool = False  # printed first, before every other table (the headline)
