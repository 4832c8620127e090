"""Every file the project reads or writes: typed decoding with one-line errors, strict YAML, strict JSON.

Readers declare what a file holds as msgspec Structs (types, `msgspec.Meta` bounds, and
`__post_init__` checks that raise `Invalid`); `convert` and `decode_json` turn whatever msgspec
refuses into the project's one error line, `FILE: field 'PATH': problem` (`DohnutsError`, with
`source` the file and `field` the path msgspec reports, e.g. `shape.seq_tokens`,
`questions[0].candidates`, `ceilings.mm.factors.clock_hz`).

    class Shape(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
        questions: Annotated[int, Meta(ge=1, le=4096)] = 8
    shape = convert(data, Shape, source="w.yaml", prefix="shape")

Also here, because every reader and writer shares them: `read_yaml` (refuses duplicate keys, one
line for every YAML failure), `dumps` / `write_json` (the one strict-JSON writer: never a bare
NaN or Infinity), and the small helpers their checks use (`short`, `one_line`, `why_not_finite`,
`first_nonfinite`, `median`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any

import msgspec
import orjson
import yaml

from dohnuts.errors import ConfigError, DohnutsError

MAX_FLOAT = 1.7976931348623157e308
# A float that must be finite: the bounds refuse ±inf and NaN (which fails every comparison).
Finite = Annotated[float, msgspec.Meta(ge=-MAX_FLOAT, le=MAX_FLOAT)]
NonNegative = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_FLOAT)]
Positive = Annotated[float, msgspec.Meta(gt=0.0, le=MAX_FLOAT)]
NonBlank = Annotated[str, msgspec.Meta(pattern=r"\S")]  # a string with something in it


class Invalid(ConfigError, ValueError):
    """A `__post_init__` check that failed. msgspec reports it at the Struct's path, to which
    `field` (relative to the Struct) is added; constructed directly, it is a ConfigError."""

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message, field=field)


# -- small helpers ---------------------------------------------------------------------------------


def one_line(text: Any) -> str:
    return " ".join(str(text).split())


def short(value: Any, limit: int = 80, convert=repr) -> str:
    """convert(value) (repr by default) on one line, cut to `limit` characters: an error message
    stays one readable line."""
    try:
        text = " ".join(convert(value).split())
    except ValueError:  # an integer too long to print
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def why_not_finite(x: Any) -> str | None:
    """Why `x` is not a finite number (None when it is one). Booleans are not numbers here."""
    if isinstance(x, bool):
        return "a boolean"
    if not isinstance(x, (int, float)):
        return f"a {type(x).__name__}"
    try:
        f = float(x)
    except OverflowError:
        return "too large for a float"
    if math.isnan(f):
        return "NaN"
    return "infinite" if math.isinf(f) else None


def is_finite(x: Any) -> bool:
    return why_not_finite(x) is None


def first_nonfinite(obj: Any) -> str | None:
    """The dotted path of the first non-finite float in a parsed JSON value, or None."""
    stack = [(obj, "")]
    while stack:
        x, at = stack.pop()
        if isinstance(x, float) and not math.isfinite(x):
            return at or "the value"
        if isinstance(x, dict):
            stack.extend((v, f"{at}.{k}" if at else str(k)) for k, v in reversed(list(x.items())))
        elif isinstance(x, (list, tuple)):
            stack.extend((v, f"{at}[{i}]") for i, v in reversed(list(enumerate(x))))
    return None


def median(values) -> float:
    """The median of a non-empty iterable, as a float (statistics.median's arithmetic)."""
    xs = sorted(values)
    n = len(xs)
    return float(xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2)


def _escape(text: str | None) -> str | None:
    """`text` with every unprintable character (newline, NUL, ...) written as its escape."""
    if text is None or text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def one_line_error(exc: DohnutsError) -> DohnutsError:
    """`exc` as one line: a key, path or value holding a newline or another control character
    (a YAML key may hold anything) is written with escapes. Same class, same fields."""
    message, source, field = _escape(exc.message), _escape(exc.source), _escape(exc.field)
    if (message, source, field) == (exc.message, exc.source, exc.field):
        return exc
    return type(exc)(message, source=source, field=field)


# -- strict JSON -----------------------------------------------------------------------------------


def json_safe(obj: Any, nonfinite: list[str] | None = None, at: str = "") -> Any:
    """`obj` with every non-finite float (NaN, ±inf) replaced by None (its path appended to
    `nonfinite` when given), tuples as lists: what strict JSON can hold."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        if nonfinite is not None:
            nonfinite.append(at)
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v, nonfinite, f"{at}.{k}" if at else str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v, nonfinite, f"{at}.{i}") for i, v in enumerate(obj)]
    return obj


def dumps(obj: Any, *, compact: bool = False, list_nonfinite: bool = False, **kw) -> str:
    """Strict JSON (never a bare NaN or Infinity; `json.dumps` keywords otherwise): a non-finite
    number is written as null, and with `list_nonfinite` its path is listed under the object's
    `nonfinite` key (the training log names what went wrong). `compact`: one line without spaces,
    formatted by orjson (prediction results: serialising is on a single call's critical path;
    text-2b's serialize + to_json 0.15 → 0.05 ms on the CPU against json, docs/evolution.md M20)."""
    if compact and not list_nonfinite and not kw:
        try:
            return orjson.dumps(obj).decode()  # a non-finite float is written as null
        except (TypeError, orjson.JSONEncodeError):  # e.g. an integer beyond 64 bits
            kw = {"separators": (",", ":")}
    if not list_nonfinite:
        try:
            return json.dumps(obj, allow_nan=False, **kw)
        except ValueError:
            return json.dumps(json_safe(obj), allow_nan=False, **kw)
    bad: list[str] = []
    clean = json_safe(obj, bad)
    if bad:
        clean["nonfinite"] = bad
    return json.dumps(clean, allow_nan=False, **kw)


def write_json(path: str | Path, obj: Any, **kw) -> None:
    """Write `obj` as strict JSON (`dumps`) atomically: a temporary file beside `path`, then a
    rename, so an interrupted write leaves the previous file (or none), never half of one."""
    path = Path(path)
    text = dumps(obj, **kw)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


# -- typed decoding --------------------------------------------------------------------------------


def convert(data: Any, type_: Any, *, source: str | None, error: type[DohnutsError] = ConfigError,
            prefix: str = "", dec_hook=None) -> Any:
    """`data` (parsed YAML or JSON) as `type_`, or one `error` naming `source` and the field."""
    try:
        return msgspec.convert(data, type_, dec_hook=dec_hook)
    except msgspec.ValidationError as exc:
        raise problem(exc, type_, data, source=source, error=error, prefix=prefix, dec_hook=dec_hook) from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer too long to convert
        raise error(f"cannot be read ({one_line(exc)})", source=source, field=prefix or None) from None


def decode_json(raw: bytes | str, type_: Any, *, source: str | None, error: type[DohnutsError] = ConfigError,
                dec_hook=None) -> Any:
    """One JSON document as `type_` (msgspec's decoder: fast, strict about NaN and UTF-8)."""
    try:
        return msgspec.json.decode(raw, type=type_, dec_hook=dec_hook)
    except msgspec.ValidationError as exc:
        data = msgspec.json.decode(raw)  # the document is valid JSON: for the value's description
        raise problem(exc, type_, data, source=source, error=error, dec_hook=dec_hook) from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise error(f"is not valid JSON ({one_line(exc)})", source=source) from None


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `(?P<key>key` in `)?\$(?P<path>[^`]*)`)?$", re.S)
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_WORDS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false", "null": "null",
          "array": "a list", "object": "a mapping", "bytes": "bytes", "date": "a date", "datetime": "a date and time"}


def problem(exc: msgspec.ValidationError, type_: Any, data: Any, *, source: str | None,
            error: type[DohnutsError] = ConfigError, prefix: str = "", dec_hook=None) -> DohnutsError:
    """msgspec's ValidationError as the project's one-line error: the path msgspec reports (a
    dict's key resolved from the data), and the problem in words with the value that was found."""
    m = _AT.match(str(exc))
    msg, path, at_key = m["msg"], m["path"] or "", bool(m["key"])
    parts = [prefix] if prefix else []
    value, t = data, type_
    about = _description(t)  # what the innermost described field on the path holds
    for name, index in _STEP.findall(path):
        if name:
            parts.append(name)
            value = value.get(name) if isinstance(value, dict) else None
        elif index == "...":  # an entry of a mapping: msgspec does not say which
            t = _child(t, "...", value)
            key = _failing_key(value, t, dec_hook)
            parts.append("[...]" if key is None else key if isinstance(key, str) else f"[{short(key)}]")
            value = value.get(key) if isinstance(value, dict) else None
            about = _description(t) or about
            continue
        else:
            parts.append(f"[{index}]")
            value = value[int(index)] if isinstance(value, (list, tuple)) and int(index) < len(value) else None
        t = _child(t, name or int(index), value)
        about = _description(t) or about
    cause = exc.__cause__
    if isinstance(cause, Invalid):
        if cause.field:
            parts.append(cause.field)
        msg = cause.message
    elif isinstance(cause, (ValueError, TypeError)) and str(cause) == msg:
        pass  # a dec_hook's own words
    elif at_key:
        bad = next((k for k in value if not isinstance(k, str)), None) if isinstance(value, dict) else None
        msg = f"has a key that is not a string ({short(bad)})" if bad is not None else _words(msg, None, t)
    else:
        msg, extra = _words(msg, value, t) + (f" ({about})" if about else ""), None
        for pattern in (r"Object missing required field `([^`]*)`", r"Object contains unknown field `([^`]*)`"):
            found = re.fullmatch(pattern, str(exc).split(" - at ")[0])
            if found:
                parts.append(found[1])
                extra = found[1]
        if extra is not None and "unknown" in str(exc):
            known = _field_names(t)
            msg = "unknown field" + (f" (known: {', '.join(known)})" if known else "")
        elif extra is not None:
            msg = "is missing"
    field = ".".join(parts).replace(".[", "[") or None
    return one_line_error(error(msg, source=source, field=field))


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else f"infinite ({value})"
    if isinstance(value, int) and abs(value) >= 10**15:
        return "a very large number"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return "null" if value is None else short(value)


def _type_words(text: str) -> str:
    return " or ".join(_WORDS.get(w, w) for w in text.split(" | "))


def _words(msg: str, value: Any, t: Any) -> str:
    """msgspec's message in the project's words."""
    m = re.fullmatch(r"Expected `([^`]*)`, got `([^`]*)`", msg)
    if m:
        got = _describe(value) if value is not None or m[2] == "null" else m[2]
        if m[1].startswith("int") and isinstance(value, float) and math.isfinite(value):
            got += ", not an integer"
        return f"must be {_type_words(m[1])}, got {got}"
    m = re.fullmatch(r"Expected `([^`]*)` (>=|<=|>|<) (\S+)", msg)
    if m:
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number, got {_describe(value)}"
        if m[2] == ">" and float(m[3]) == 0:
            return f"must be positive, got {_describe(value)}"
        return f"must be {m[2]} {m[3]}, got {_describe(value)}"
    m = re.fullmatch(r"Expected `(\w+)` of length (>=|<=)? ?(\d+)(?:, got (\d+))?", msg)
    if m:
        unit = "characters" if m[1] == "str" else "entries"
        if m[2] == ">=" and m[3] == "1":
            return "is empty"
        what = {">=": "at least", "<=": "at most", None: "exactly"}[m[2]]
        got = m[4] or (len(value) if hasattr(value, "__len__") else "?")
        return f"must hold {what} {m[3]} {unit}, got {got}"
    m = re.fullmatch(r"Expected `str` matching regex '(.*)'", msg)
    if m:
        return "must not be empty or blank" if m[1] == r"\\S" else f"must match {m[1]}, got {_describe(value)}"
    if msg.startswith("Invalid enum value"):
        choices = _choices(t)
        return f"must be one of {choices}, got {_describe(value)}" if choices else msg.replace("Invalid", "is an invalid")
    if msg in ("Number out of range", "Integer value out of range"):
        return "is out of range (too large for a number)"
    return one_line(msg.replace("`", "'"))


# -- following a msgspec path through the declared types -------------------------------------------


def _description(t: Any) -> str | None:
    """The `Meta(description=...)` a declared type carries, if any."""
    while typing.get_origin(t) is Annotated:
        for meta in typing.get_args(t)[1:]:
            if isinstance(meta, msgspec.Meta) and meta.description:
                return meta.description
        t = typing.get_args(t)[0]
    return None


def _strip(t: Any) -> Any:
    while typing.get_origin(t) is Annotated:
        t = typing.get_args(t)[0]
    return t


def _member(t: Any, value: Any) -> Any:
    """The member of a union that `value` (a mapping, a list, or a scalar) would be checked against."""
    t = _strip(t)
    if typing.get_origin(t) not in (typing.Union, types.UnionType):
        return t
    args = [_strip(a) for a in typing.get_args(t) if a is not type(None)]
    for a in args:
        mapping = isinstance(a, type) and (issubclass(a, msgspec.Struct) or dataclasses.is_dataclass(a)) or \
            typing.get_origin(a) is dict
        listing = typing.get_origin(a) in (list, tuple, set, frozenset)
        if (isinstance(value, dict) and mapping) or (isinstance(value, list) and listing):
            return a
    return args[0] if len(args) == 1 else Any


def _fields(t: Any) -> dict[str, Any]:
    if isinstance(t, type) and issubclass(t, msgspec.Struct):
        return {f.encode_name: f.type for f in msgspec.structs.fields(t)}
    if isinstance(t, type) and dataclasses.is_dataclass(t):
        return typing.get_type_hints(t, include_extras=True)
    return {}


def _field_names(t: Any) -> list[str]:
    return list(_fields(_member(t, {})))


def _child(t: Any, step: Any, value: Any) -> Any:
    t = _member(t, value if step == "..." else {} if isinstance(step, str) else [])
    origin, args = typing.get_origin(t), typing.get_args(t)
    if isinstance(step, str) and step != "...":
        return _fields(t).get(step, Any)
    if origin is dict:
        return args[1] if args else Any
    if origin is tuple and args:
        return args[0] if len(args) == 2 and args[1] is Ellipsis else args[min(step, len(args) - 1)]
    if origin in (list, set, frozenset) and args:
        return args[0]
    return Any


def _failing_key(value: Any, value_type: Any, dec_hook) -> Any:
    """The first key of a mapping whose value does not convert to `value_type` (msgspec reports
    a mapping's entries as `[...]`); None when none fails alone."""
    if not isinstance(value, dict):
        return None
    for key, item in value.items():
        try:
            msgspec.convert(item, value_type, dec_hook=dec_hook)
        except (msgspec.ValidationError, ValueError, TypeError):
            return key
    return None


def _choices(t: Any) -> list | None:
    t = _strip(t)
    if typing.get_origin(t) is typing.Literal:
        return list(typing.get_args(t))
    return None


# -- strict YAML -----------------------------------------------------------------------------------


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
