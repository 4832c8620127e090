"""The YAML format of a hardware spec, as msgspec Structs: `HwSpecFile` and its `CeilingFile`s.

The format is documented in hwspecs/README.md and dohnuts/bench/analysis/hwspec.py (which turns a
validated file into a `HwSpec`); `MeasuredSection` is the `measured:` section `dohnuts-bench
calibrate` writes. Types and bounds are declared here; what needs several fields
(a ceiling's value against the product of its factors, a role naming a defined ceiling of the
right kind) is checked in `__post_init__`, so every problem is one `ConfigError` naming the file
and the dotted field, e.g. `ceilings.bf16_matrix.factors.clock_hz`.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Mapping

import msgspec
from msgspec import Meta

from dohnuts.schema import Invalid, NonBlank, short

COMPUTE_ROLES = ("matrix", "attention", "scan", "vector")  # kinds of FLOPs (dohnuts.bench.analysis.flops)
BANDWIDTH_ROLES = ("memory", "host_link", "interconnect")  # device memory, host<->device, device<->device
REQUIRED_ROLES = COMPUTE_ROLES + ("memory", "host_link")  # `interconnect` is optional (one-device specs)
ROLES = COMPUTE_ROLES + BANDWIDTH_ROLES
PRODUCT_TOLERANCE = 1e-3  # stated value vs product of factors


class Number(float):
    """A finite number in a spec. Also written as a string, because PyYAML reads `2.5e9` (no
    exponent sign) as one, and as a fraction `a/b`, so a factor can be exact (PCIe's 128/130)."""


class Rate(Number):
    """A positive finite number: a ceiling's value or one of its factors."""


def parse_number(type_: type, value: Any) -> Number:
    """msgspec's dec_hook for `Number` and `Rate`: ValueError in words, which msgspec reports at the field."""
    if type_ not in (Number, Rate):
        raise NotImplementedError
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"must be a number, got {short(value)}")
    try:
        if isinstance(value, str) and "/" in value:
            num, den = value.split("/")
            out = float(num) / float(den)
        else:
            out = float(value)
    except (ValueError, ZeroDivisionError, OverflowError):
        raise ValueError(f"must be a number or a fraction a/b, got {short(value)}") from None
    if not math.isfinite(out):
        raise ValueError(f"must be finite, got {short(value)}")
    if type_ is Rate and out <= 0:
        raise ValueError(f"must be positive, got {short(value)}")
    return type_(out)


class CeilingFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One entry of `ceilings` (module docstring)."""

    kind: Literal["compute", "bandwidth"]
    provenance: Literal["datasheet", "derived", "measured"]
    source: NonBlank  # where the number (or each factor) comes from
    factors: dict[str, Rate] | None = None
    value: Rate | None = None  # optional when factors are given; checked against them
    date: Any = None  # required for measured ceilings
    note: Any = None
    unit: Any = None

    def __post_init__(self) -> None:
        if self.value is None and not self.factors:
            raise Invalid("is missing (give the value, its factors, or both)", field="value")
        if self.provenance == "derived" and not self.factors:
            raise Invalid("is required for a derived ceiling", field="factors")
        if self.provenance == "measured" and not self.date:
            raise Invalid("is required for a measured ceiling (when it was measured)", field="date")
        if self.factors:
            value = self.product()
            if not math.isfinite(value) or value <= 0:
                raise Invalid(f"multiply to {value!r}, not a positive finite rate", field="factors")
            if self.value is not None and abs(self.value - value) > PRODUCT_TOLERANCE * value:
                raise Invalid(f"is {self.value:.6g} but its factors multiply to {value:.6g} "
                              f"({abs(self.value - value) / value:.3%} apart, more than {PRODUCT_TOLERANCE:.1%})",
                              field="value")
        expected = "FLOP/s" if self.kind == "compute" else "B/s"
        if self.unit is not None and self.unit != expected:
            raise Invalid(f"must be {expected!r} for a {self.kind} ceiling, got {short(self.unit)}", field="unit")

    def product(self) -> float:
        return math.prod(float(v) for v in (self.factors or {}).values())


RoleTable = dict[str, dict[str, str | None]]  # precision → role → ceiling name

# The microbenchmarks dohnuts-bench measures (bench_plugins/analyzers/microbench.py) and the kind of
# each: the keys a `measured:` section may hold (dohnuts.bench.analysis.hwspec maps them to roles).
MICROBENCHMARKS = {
    "bf16_matmul": "compute", "bf16_matmul_sustained": "compute", "fp32_matmul": "compute", "fp32_fma": "compute",
    "fp32_vector": "compute", "device_copy": "bandwidth", "h2d_pinned": "bandwidth", "d2h_pinned": "bandwidth",
    "host_copy": "bandwidth", "allreduce_busbw": "bandwidth",
}


class MeasuredCeilingFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One entry of `measured.ceilings`: a microbenchmark's result, as the harness records it."""

    value: Rate
    kind: Literal["compute", "bandwidth"]
    method: NonBlank  # what was timed, and how
    date: Any  # when
    unit: Any = None

    def __post_init__(self) -> None:
        if not self.date:
            raise Invalid("is required (when it was measured)", field="date")
        expected = "FLOP/s" if self.kind == "compute" else "B/s"
        if self.unit is not None and self.unit != expected:
            raise Invalid(f"must be {expected!r} for a {self.kind} measurement, got {short(self.unit)}", field="unit")


class MeasuredSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`measured:` — the device's own ceilings, measured by `dohnuts-bench calibrate` on the card
    (the datasheet `ceilings` beside it stay as they are)."""

    date: Any  # when
    device: NonBlank  # the device measured, as torch names it
    method: NonBlank  # the command and code that measured
    ceilings: Annotated[dict[str, MeasuredCeilingFile], Meta(min_length=1)]
    provenance: dict[str, Any] | None = None  # the software stack and device facts at the time

    def __post_init__(self) -> None:
        if not self.date:
            raise Invalid("is required (when the section was measured)", field="date")
        for key, entry in self.ceilings.items():
            if key not in MICROBENCHMARKS:
                raise Invalid(f"is not a microbenchmark dohnuts-bench measures (known: {', '.join(MICROBENCHMARKS)})",
                              field=f"ceilings.{key}")
            if entry.kind != MICROBENCHMARKS[key]:
                raise Invalid(f"must be {MICROBENCHMARKS[key]!r} for {key}, got {entry.kind!r}",
                              field=f"ceilings.{key}.kind")


class HwSpecFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A hardware-spec YAML file (module docstring, hwspecs/README.md)."""

    name: NonBlank
    ceilings: Annotated[dict[str, CeilingFile], Meta(min_length=1)]
    roles: Annotated[RoleTable, Meta(min_length=1)]
    schema: Literal[1] = 1
    description: Any = ""
    device_names: list[Annotated[str, Meta(min_length=1)]] = []
    target_fraction: Number = Number(0.8)
    overlap_compute_kinds: bool = False  # may matrix and vector work run at the same time?
    measured_roles: RoleTable | None = None
    measured: MeasuredSection | None = None
    memory_capacity_bytes: Any = None

    def __post_init__(self) -> None:
        if not 0.0 < self.target_fraction <= 1.0:
            raise Invalid(f"must lie in (0, 1], got {float(self.target_fraction)}", field="target_fraction")
        _check_roles(self.roles, self.ceilings, "roles", required=True)
        _check_roles(self.measured_roles or {}, self.ceilings, "measured_roles", required=False)
        for precision in self.measured_roles or {}:
            if precision not in self.roles:
                raise Invalid(f"names precision {precision!r}, which `roles` does not",
                              field=f"measured_roles.{precision}")


def _check_roles(tables: RoleTable, ceilings: Mapping[str, CeilingFile], key: str, *, required: bool) -> None:
    """Every role a role name, every required role present, every name a defined ceiling of the
    right kind (and a measured one in `measured_roles`)."""
    for precision, table in tables.items():
        where = f"{key}.{precision}"
        for role in table:
            if role not in ROLES:
                raise Invalid(f"is not a role (expected one of {ROLES})", field=f"{where}.{role}")
        if required:
            for role in REQUIRED_ROLES:
                if table.get(role) is None:
                    raise Invalid("is missing: every role needs a ceiling", field=f"{where}.{role}")
        for role, name in table.items():
            if name not in ceilings:
                raise Invalid(f"names ceiling {short(name)}, which is not defined under `ceilings`",
                              field=f"{where}.{role}")
            want = "compute" if role in COMPUTE_ROLES else "bandwidth"
            if ceilings[name].kind != want:
                raise Invalid(f"needs a {want} ceiling, but {name!r} is {ceilings[name].kind}", field=f"{where}.{role}")
            if key == "measured_roles" and ceilings[name].provenance != "measured":
                raise Invalid(f"may only name measured ceilings; {name!r} is {ceilings[name].provenance}",
                              field=f"{where}.{role}")
