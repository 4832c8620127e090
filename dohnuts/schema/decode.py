"""Typed decoding: parsed YAML or JSON → msgspec Structs, and whatever msgspec refuses → the project's
one error line, `FILE: field 'PATH': problem` (the path msgspec reports; a mapping's key found
again from the data; the problem in words, with the value found and the field's `Meta`
description).

A Struct's field types and `Meta` bounds are its rules. msgspec checks them when it decodes, not
when a Struct is built in code; a Struct that must hold to them however it is made (the model and
training configs) calls `check_fields(self)` first in its `__post_init__`."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import types
import typing
from typing import Annotated, Any

import msgspec

from dohnuts.errors import ConfigError, DohnutsError
from dohnuts.schema.user_files import read_file
from dohnuts.schema.values import first_nonfinite, one_line, one_line_error, short

MAX_FLOAT = 1.7976931348623157e308
# A float that must be finite: the bounds refuse ±inf and NaN (which fails every comparison).
Finite = Annotated[float, msgspec.Meta(ge=-MAX_FLOAT, le=MAX_FLOAT)]
NonNegative = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_FLOAT)]
Positive = Annotated[float, msgspec.Meta(gt=0.0, le=MAX_FLOAT)]
NonBlank = Annotated[str, msgspec.Meta(pattern=r"\S")]  # a string with something in it


def integer_in(lo: int, hi: int, description: str | None = None) -> Any:
    """An integer in lo..hi, refused as `must be an integer in lo..hi, got X`."""
    return Annotated[int, msgspec.Meta(ge=lo, le=hi, description=description,
                                       extra={"words": f"an integer in {lo}..{hi}"})]


def number_in(words: str, description: str | None = None, **bounds: float) -> Any:
    """A finite number within `bounds` (msgspec.Meta's ge, gt, le, lt), refused as `must be WORDS, got X`
    (`number_in("a number in [0, 1)", ge=0.0, lt=1.0)`); a NaN or an infinity as not finite."""
    bounds.setdefault("ge" if "gt" not in bounds else "gt", -MAX_FLOAT)
    bounds.setdefault("le" if "lt" not in bounds else "lt", MAX_FLOAT)
    return Annotated[float, msgspec.Meta(**bounds, description=description, extra={"words": words})]


class Invalid(ConfigError, ValueError):
    """A `__post_init__` check that failed. msgspec reports it at the Struct's path, to which
    `field` (relative to the Struct) is added; constructed directly, it is a ConfigError."""

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message, field=field)


def check_fields(obj: msgspec.Struct) -> None:
    """Every field of a Struct built in code checked against its declared type and bounds, as
    msgspec checks a decoded one, and kept as decoding would keep it (a list for a tuple becomes a
    tuple, an integer for a float a float); the first that fails raises `Invalid` naming it. A
    Struct that msgspec decoded passes unchanged (a nested Struct is not checked again)."""
    for name, type_ in _declared(type(obj)):
        value = getattr(obj, name)
        try:
            kept = msgspec.convert(value, type_)
        except msgspec.ValidationError as exc:
            err = problem(exc, type_, value, source=None, prefix=name)
            raise Invalid(err.message, field=err.field) from None
        except (ValueError, RecursionError) as exc:  # e.g. an integer too long to convert
            raise Invalid(f"cannot be read ({one_line(exc)})", field=name) from None
        if kept is not value:
            msgspec.structs.force_setattr(obj, name, kept)


@functools.cache
def _declared(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, declared type) of each field of a Struct class (msgspec.structs.fields evaluates the
    annotations again at every call)."""
    return tuple((f.name, f.type) for f in msgspec.structs.fields(cls))


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
        try:
            data = msgspec.json.decode(raw)  # valid JSON, of the wrong shape: the values, for the message
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            data = None
        raise problem(exc, type_, data, source=source, error=error, dec_hook=dec_hook) from None
    except (msgspec.DecodeError, RecursionError) as exc:
        nonfinite = _nonfinite_token(raw)
        if nonfinite is not None:  # NaN / Infinity: not JSON, but say where, as for any other bad value
            field, what = nonfinite
            raise one_line_error(error(f"must be a finite number, got {what}", source=source, field=field)) from None
        raise error(f"is not valid JSON ({one_line(exc)})", source=source) from None


def read_json(path, type_: Any = Any, *, max_bytes: int, error: type[DohnutsError] = ConfigError,
              what: str = "a JSON file", dec_hook=None) -> Any:
    """A JSON file a user names, as `type_`: a regular file within `max_bytes` (checked by its stat
    before it is opened: dohnuts.schema.user_files), one strict JSON document; one `error` line
    naming the file (and the field) otherwise."""
    raw = read_file(path, max_bytes=max_bytes, error=error, what=what)
    return decode_json(raw, type_, source=str(path), error=error, dec_hook=dec_hook)


def _nonfinite_token(raw: bytes | str) -> tuple[str, str] | None:
    """(path, NaN or infinite) of the first NaN / Infinity token of a document that is JSON but for
    them (Python's reader takes them), else None."""
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError, TypeError):
        return None
    path = first_nonfinite(obj)
    if path is None:
        return None
    value = obj
    for step in re.findall(r"[^.\[\]]+|\[\d+\]", path) if path != "the value" else []:
        if step.startswith("[") and isinstance(value, list):
            value = value[int(step[1:-1])]
        else:
            value = value.get(step) if isinstance(value, dict) else None
    what = ("NaN" if math.isnan(value) else "infinite") if isinstance(value, float) else "NaN or infinite"
    return (None if path == "the value" else path), what


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
        found = re.fullmatch(r"Object (missing required|contains unknown) field `([^`]*)`", msg)
        if found is None:
            msg = _words(msg, value, t) + (f" ({about})" if about else "")
        else:
            parts.append(found[2])
            known = _field_names(t)
            msg = "is missing" if found[1] == "missing required" else \
                "unknown field" + (f" (known: {', '.join(known)})" if known else "")
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
        words = _extra(t, "words")
        if words:
            return f"must be {words}, got {_describe(value)}"
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


def _extra(t: Any, key: str) -> Any:
    """`Meta(extra={key: ...})` of a declared type, if any (e.g. the `words` of `integer_in`)."""
    while typing.get_origin(t) is Annotated:
        for meta in typing.get_args(t)[1:]:
            if isinstance(meta, msgspec.Meta) and meta.extra and key in meta.extra:
                return meta.extra[key]
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
