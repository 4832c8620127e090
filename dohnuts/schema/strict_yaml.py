"""YAML read strictly: a key written twice in one mapping is an error (plain YAML keeps the last one,
silently), and every failure (missing, a directory, a device or a pipe, over the size limit, not
text, not YAML) is one ConfigError line.

Bounded: a file over `MAX_YAML_BYTES` is not read, and a document whose aliases expand it to more
than `MAX_YAML_VALUES` values (nested `*alias` lists: a few hundred bytes that stand for millions
of values once copied, e.g. into every benchmark record) is refused before it is built. Numbers
follow YAML 1.2: `1e12` is a number (PyYAML's YAML 1.1 reads it as the string '1e12')."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from dohnuts.errors import ConfigError
from dohnuts.schema.user_files import MIB, read_file
from dohnuts.schema.values import one_line, one_line_error, short

MAX_YAML_BYTES = 4 * MIB
MAX_YAML_VALUES = 100_000  # scalars, lists and mappings of a document, its aliases expanded


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping that holds the same key twice (plain YAML keeps the last one, silently)."""

    def __init__(self, key: Any, first, again):
        super().__init__("while constructing a mapping", first, f"found duplicate key {short(key)}", again)
        self.key = key


class StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses duplicate keys. Merge keys (`<<: *base`) may still be
    overridden: only the keys written in the mapping itself are compared."""

    def flatten_mapping(self, node):
        if not getattr(node, "_dohnuts_checked", False):  # before the merges are spliced in
            node._dohnuts_checked = True
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the constructor refuses it itself
                    continue
                if first is not None:
                    raise DuplicateKeyError(key, first, key_node.start_mark)
                seen[key] = key_node.start_mark
        super().flatten_mapping(node)


# YAML 1.2's floats with an exponent but no dot (`1e12`, `5E-3`): YAML 1.1 (PyYAML) reads them as strings.
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                                   list("-+0123456789"))


def expanded_size(root: yaml.Node, limit: int = MAX_YAML_VALUES) -> int:
    """How many values (scalars, sequences, mappings) the document holds once every alias is
    expanded, counted on the composed nodes without building anything; stops past `limit` (and at
    a node that contains itself, which expands without end) returning limit + 1."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = 1
            continue
        kids = [x for pair in node.value for x in pair] if isinstance(node, yaml.MappingNode) else list(node.value)
        if children_done:
            open_.discard(key)
            sizes[key] = min(limit + 1, 1 + sum(sizes[id(k)] for k in kids))
            continue
        if key in open_:
            return limit + 1  # a node that contains itself
        open_.add(key)
        stack.append((node, True))
        for k in kids:
            if id(k) in open_:
                return limit + 1
            if id(k) not in sizes:
                stack.append((k, False))
    return sizes[id(root)]


def yaml_error(exc: BaseException, source: str) -> ConfigError:
    """One ConfigError line for whatever parsing a YAML file raised."""
    if isinstance(exc, DuplicateKeyError):
        return ConfigError(f"has the key {short(exc.key)} twice (line {exc.context_mark.line + 1} and line "
                           f"{exc.problem_mark.line + 1}); a key may appear once per mapping", source=source,
                           field=exc.key if isinstance(exc.key, str) else short(exc.key))
    if isinstance(exc, yaml.reader.ReaderError):
        char = exc.character
        code = char if isinstance(char, int) else (char[0] if isinstance(char, bytes) else ord(char[:1] or "\0"))
        if exc.encoding == "unicode" or isinstance(char, str):  # decoded, but a character YAML refuses
            what = f"is not YAML text: unacceptable character #x{code:04x} at position {exc.position} ({exc.reason})"
        else:  # undecodable bytes (PyYAML gives the byte as an int)
            what = f"is not {exc.encoding} text (byte #x{code:02x} at offset {exc.position}: {exc.reason})"
        return ConfigError(one_line(what), source=source)
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem_ = exc.problem or exc.context or "parse error"
        return ConfigError(one_line(f"is not valid YAML{where} ({problem_})"), source=source)
    if isinstance(exc, RecursionError):
        return ConfigError("is not usable YAML (nested too deeply)", source=source)
    return ConfigError(one_line(f"is not valid YAML ({exc})"), source=source)


def read_yaml(path: str | Path) -> tuple[bytes, Any]:
    """(raw bytes, parsed document) of a YAML file; every failure is one ConfigError naming it:
    missing, a directory, a device or a pipe, over MAX_YAML_BYTES, unreadable, not text, not valid
    YAML, a duplicate key, aliases that expand past MAX_YAML_VALUES values."""
    path = Path(path)
    raw = read_file(path, max_bytes=MAX_YAML_BYTES, error=ConfigError, what="a YAML file")
    return raw, parse_yaml(raw, str(path))


def parse_yaml(raw: bytes | str, source: str) -> Any:
    """One YAML document read strictly (StrictLoader, bounded expansion); one ConfigError line otherwise."""
    loader = None
    try:
        loader = StrictLoader(raw)  # bytes: PyYAML decodes them (UTF-8, or UTF-16 with a byte-order mark)
        node = loader.get_single_node()
        if node is not None and expanded_size(node) > MAX_YAML_VALUES:
            raise ConfigError(f"expands to more than {MAX_YAML_VALUES:,} values through its aliases (*name); "
                              "write the values out, or use fewer aliases", source=source)
        return loader.construct_document(node) if node is not None else None
    except (yaml.YAMLError, RecursionError, ValueError) as exc:  # ValueError: an integer too long to read
        raise one_line_error(yaml_error(exc, source)) from None
    finally:
        if loader is not None:
            loader.dispose()
