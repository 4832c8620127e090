"""YAML read strictly: a key written twice in one mapping is an error (plain YAML keeps the last one,
silently), and every failure (missing, a directory, not text, not YAML) is one ConfigError line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dohnuts.errors import ConfigError
from dohnuts.schema.values import one_line, one_line_error, short


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
    missing, a directory, unreadable, not text, not valid YAML, a duplicate key."""
    path = Path(path)
    source = str(path)
    try:
        if not path.exists():
            raise ConfigError("does not exist", source=source)
        if path.is_dir():
            raise ConfigError("is a directory, not a YAML file", source=source)
        if not path.is_file():  # a device or a pipe could be endless
            raise ConfigError("is not a regular file", source=source)
        raw = path.read_bytes()
    except (OSError, ValueError) as exc:  # ValueError: an embedded NUL
        raise one_line_error(ConfigError(f"cannot be read ({getattr(exc, 'strerror', None) or exc})",
                                         source=source)) from None
    except ConfigError as exc:
        raise one_line_error(exc) from None
    try:
        # bytes: PyYAML decodes them (UTF-8, or UTF-16 with a byte-order mark) and says where it fails
        return raw, yaml.load(raw, Loader=StrictLoader)  # StrictLoader is a SafeLoader
    except (yaml.YAMLError, RecursionError, ValueError) as exc:  # ValueError: an integer too long to read
        raise one_line_error(yaml_error(exc, source)) from None
