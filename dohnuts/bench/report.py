"""Report sections: what analyzers hand to reporters (a title, a rich renderable, plain data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Section:
    title: str
    renderable: Any  # anything rich can print (Table, Text, Group)
    data: dict = field(default_factory=dict)  # the same content as plain JSON-able data
    files: list = field(default_factory=list)  # paths written (plots)
