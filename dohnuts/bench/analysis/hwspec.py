"""Hardware specs: the ceilings a stage's work is bounded by, with the derivation of each.

A spec is a YAML file (see hwspecs/README.md; built-in: hwspecs/rx7900xtx.yaml, hwspecs/h200.yaml):

    name: AMD Radeon RX 7900 XTX          # required
    device_names: ["7900 XTX"]            # substrings of torch's device name this spec describes
    target_fraction: 0.8                  # the "80% target" (default 0.8)
    overlap_compute_kinds: false          # may matrix and vector work run at the same time?
    ceilings:                             # one or more named ceilings
      bf16_matrix:
        kind: compute                     # compute (FLOP/s) | bandwidth (B/s)
        provenance: derived               # datasheet | derived | measured
        factors: {compute_units: 96, clock_hz: 2.5e9, flops_per_clock_per_cu: 512}
        value: 122.88e12                  # optional when factors are given; checked against them
        source: "AMD ..."                 # required: where the number (or each factor) comes from
        date: 2026-11-30                  # required for measured ceilings
        note: "..."                       # optional
    roles:                                # per precision: which ceiling bounds which kind of work
      bf16: {matrix: bf16_matrix, attention: bf16_matrix, scan: bf16_matrix, vector: fp32_vector,
             memory: gddr6, host_link: pcie4_x16}
    measured_roles:                       # optional: the same roles met by *measured* ceilings;
      bf16: {matrix: bf16_matmul_8192}    # roles left out fall back to `roles`
    measured:                             # optional: written by `dohnuts-bench calibrate` on the device
      date: 2026-12-02
      device: AMD Radeon RX 7900 XTX      # as torch names it
      method: dohnuts-bench calibrate (bench_plugins/analyzers/microbench.py)
      ceilings:                           # microbenchmark → its result, as a run records it
        bf16_matmul: {value: 1.0e14, kind: compute, method: "torch.matmul bf16 8192³ ...", date: 2026-12-02}

A ceiling's value is the product of its factors (numbers, or fractions written "128/130"); when
both are given they must agree within 0.1%, so a typo in either is caught. `derived` ceilings
must show their factors; `measured` ones must say when they were measured. The format is declared
by `HwSpecFile` and `CeilingFile` (msgspec Structs). Every problem is a ConfigError naming the
file and the dotted field (e.g. `gpu.yaml: field 'ceilings.bf16_matrix.factors.clock_hz': must be
positive, got 0`), on one line: a file that is missing, a directory, not UTF-8 text, not valid
YAML, or that holds a key twice in one mapping (dohnuts.schema.read_yaml) is refused the same way.

`with_measured_ceilings(spec, measured)` adds the ceilings the harness measures at the start of
a run (a large BF16 matmul, a device copy, pinned host copies, FP32 multiply-adds) as measured
roles. A file's `measured:` section holds the same microbenchmarks, measured once on the device
by `dohnuts-bench calibrate` (dohnuts.bench.commands.calibrate) and written beside the datasheet numbers;
the loader gives them the same roles (`with_measured_section`), and a run's own measurements
replace them for that run.

Why two role tables: a datasheet number is what the silicon allows, a measured microbenchmark
is what this software stack reaches on it; efficiency is reported against both, and a
microbenchmark is never mistaken for API throughput.

A third basis, `sustained`, exists only where the sustained matmul was measured — by the run, or
in the file's `measured:` section (never in its role tables): the
measured basis with its matrix, attention and scan roles met by the same matmul run back to back
for seconds (`bf16_matmul_sustained`). A datacentre GPU holds its power limit under dense work by
lowering its clock, so a pass longer than the burst the measured ceiling times cannot reach that
ceiling (the H200: docs/known-issues.md KI-15). The sustained basis says how close it comes to what the GPU sustains; the
measured basis keeps meaning what it meant.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from dohnuts.bench.analysis.hwspec_file import (  # noqa: F401 - the roles are this module's API too
    BANDWIDTH_ROLES, COMPUTE_ROLES, PRODUCT_TOLERANCE, REQUIRED_ROLES, ROLES, HwSpecFile, MeasuredSection, parse_number,
)
from dohnuts.errors import ConfigError
from dohnuts.schema import convert, read_yaml

BASES = ("datasheet", "measured", "sustained")  # `datasheet` = the `roles` table (datasheet or derived numbers)
# The repository's hwspecs/, reached through the dohnuts/bench/hwspecs link, which installs as package data.
BUILTIN_DIR = Path(__file__).resolve().parents[1] / "hwspecs"


@dataclass(frozen=True)
class Ceiling:
    """One rate limit of the device: FLOP/s (compute) or B/s (bandwidth), and where it comes from."""

    name: str
    kind: str  # "compute" | "bandwidth"
    value: float  # FLOP/s or B/s; the product of `factors` when they are given
    provenance: str  # "datasheet" | "derived" | "measured"
    source: str
    factors: tuple[tuple[str, float], ...] = ()
    stated: float | None = None  # the value as written in the file, if any
    date: str | None = None
    note: str | None = None

    @property
    def unit(self) -> str:
        return "FLOP/s" if self.kind == "compute" else "B/s"

    def target(self, fraction: float) -> float:
        """The rate a stage must reach to meet the target (e.g. 0.8 × 122.88e12 = 98.304e12)."""
        return self.value * fraction

    def describe(self) -> str:
        """`96 × 2.5e+09 × 512 = 1.229e+14 FLOP/s (derived)`: the derivation in one line."""
        text = f"{self.value:.4g} {self.unit} ({self.provenance})"
        if self.factors:
            text = " × ".join(f"{v:g}" for _, v in self.factors) + " = " + text
        return text


@dataclass(frozen=True)
class HwSpec:
    """A device: its named ceilings and which ceiling bounds which kind of work, per precision."""

    name: str
    ceilings: Mapping[str, Ceiling]
    roles: Mapping[str, Mapping[str, str]]  # precision → role → ceiling name
    measured_roles: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # precision → role → ceiling measured under sustained load (set from measurements only);
    # roles left out fall back to the measured basis, then to the datasheet
    sustained_roles: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    target_fraction: float = 0.8
    overlap_compute_kinds: bool = False
    device_names: tuple[str, ...] = ()
    description: str = ""
    source: str | None = None  # the file it was read from
    # the file's `measured:` section, when it has one: {"date", "device", "method"} of the calibration
    calibration: Mapping[str, str] | None = None

    def precisions(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.roles, *self.measured_roles)))

    def has_measured(self, precision: str) -> bool:
        return bool(self.measured_roles.get(precision))

    def bases(self, precision: str) -> tuple[str, ...]:
        """The bases a bound at `precision` is reported on: the datasheet (the `roles` table) when
        the spec has one, the measured ceilings when it has them — a spec synthesised from this
        machine's microbenchmarks has only the latter."""
        out = (("datasheet",) if precision in self.roles else ()) + (("measured",) if self.has_measured(precision)
                                                                      else ())
        if self.sustained_roles.get(precision):
            out += ("sustained",)
        return out

    def ceiling(self, role: str, precision: str, basis: str = "datasheet") -> Ceiling:
        """The ceiling that bounds `role` work at `precision`. The measured basis falls back to
        the datasheet ceiling for roles nobody measured (the limiter then names that ceiling)."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r} (expected one of {ROLES})")
        if basis not in BASES:
            raise ValueError(f"unknown basis {basis!r} (expected one of {BASES})")
        if basis == "sustained" and role in self.sustained_roles.get(precision, {}):
            return self.ceilings[self.sustained_roles[precision][role]]
        if basis in ("measured", "sustained") and role in self.measured_roles.get(precision, {}):
            return self.ceilings[self.measured_roles[precision][role]]
        if precision not in self.roles:
            raise ConfigError(f"has no {basis} ceiling for {role!r} work at precision {precision!r} "
                              f"(it has roles for {', '.join(self.precisions()) or 'none'})",
                              source=self.source, field="roles")
        return self.ceilings[self.roles[precision][role]]

    def has_role(self, role: str, precision: str, basis: str = "datasheet") -> bool:
        """Whether `ceiling(role, precision, basis)` has a ceiling to give (an optional role such as
        `interconnect` may be absent)."""
        if basis == "sustained" and role in self.sustained_roles.get(precision, {}):
            return True
        if basis in ("measured", "sustained") and role in self.measured_roles.get(precision, {}):
            return True
        return role in self.roles.get(precision, {})

    def matches(self, device_name: str) -> bool:
        """Whether a record's device name is one this spec describes (case-insensitive substring)."""
        low = device_name.lower()
        return any(n.lower() in low for n in self.device_names)


# --------------------------------------------------------------------------------------------
# Loading


def load_hwspec(path: str | Path) -> HwSpec:
    """Read and validate a hwspec YAML file."""
    _, data = read_yaml(path)  # one-line ConfigError: missing, a directory, not text, bad YAML, duplicate key
    return parse_hwspec(data, source=str(path))


def find_hwspec(name_or_path: str | Path) -> HwSpec:
    """A path to a YAML file, or the name of a built-in spec (`rx7900xtx`, `h100`, `h200`)."""
    if isinstance(name_or_path, str) and ("\x00" in name_or_path or not name_or_path.strip()):
        raise ConfigError("is neither a file nor a built-in hwspec", source=repr(name_or_path))
    path = Path(name_or_path)
    try:
        if path.suffix in (".yaml", ".yml") or path.exists():
            return load_hwspec(path)
        builtin = BUILTIN_DIR / f"{name_or_path}.yaml"
        if "/" not in str(name_or_path) and builtin.exists():
            return load_hwspec(builtin)
    except OSError as exc:  # e.g. a name too long for a path
        raise ConfigError(f"cannot be read ({exc.strerror or exc})", source=str(name_or_path)) from None
    known = sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml")) if BUILTIN_DIR.is_dir() else []
    raise ConfigError(f"is neither a file nor a built-in hwspec (known: {', '.join(known) or 'none'})",
                      source=str(name_or_path))


def hwspec_for_device(name: str | None, device_name: str) -> HwSpec | None:
    """The spec named (a built-in name or a path), else the built-in whose `device_names` match the
    device (the first in file-name order), else None."""
    if name:
        return find_hwspec(name)
    for path in sorted(BUILTIN_DIR.glob("*.yaml")) if BUILTIN_DIR.is_dir() else ():
        spec = load_hwspec(path)
        if spec.matches(device_name):
            return spec
    return None


def hwspec_ref(spec: HwSpec | None) -> str | None:
    """How run.json names a spec: a built-in's name (portable), else its file path."""
    if spec is None or spec.source is None:
        return None
    path = Path(spec.source).resolve()
    return path.stem if path.parent == BUILTIN_DIR.resolve() else str(path)


def stored_hwspec(ref: str) -> HwSpec:
    """The spec a run.json names (`hwspec_ref`: a file path or a built-in's name; an older run: the
    spec's display name)."""
    try:
        return find_hwspec(ref)
    except ConfigError:
        for path in sorted(BUILTIN_DIR.glob("*.yaml")):
            spec = find_hwspec(path)
            if spec.name == ref:
                return spec
        raise


def parse_hwspec(data: Any, *, source: str) -> HwSpec:
    """Validate the parsed YAML of a spec (`HwSpecFile`); every error names `source` and the dotted
    field, on one line (a key holding a newline is written with escapes)."""
    f = convert(data, HwSpecFile, source=source, dec_hook=parse_number)
    ceilings = {name: Ceiling(name=name, kind=c.kind, value=c.product() if c.factors else float(c.value),
                              provenance=c.provenance, source=c.source.strip(),
                              factors=tuple((k, float(v)) for k, v in (c.factors or {}).items()),
                              stated=None if c.value is None else float(c.value),
                              date=None if c.date is None else str(c.date),
                              note=None if c.note is None else str(c.note))
                for name, c in f.ceilings.items()}
    roles = {p: {r: n for r, n in t.items()} for p, t in f.roles.items()}
    measured = {p: {r: n for r, n in t.items()} for p, t in (f.measured_roles or {}).items()}
    spec = HwSpec(name=f.name.strip(), ceilings=ceilings, roles=roles, measured_roles=measured,
                  target_fraction=float(f.target_fraction), overlap_compute_kinds=f.overlap_compute_kinds,
                  device_names=tuple(f.device_names), description=str(f.description), source=source)
    return spec if f.measured is None else with_measured_section(spec, f.measured)


# --------------------------------------------------------------------------------------------
# Ceilings measured by the harness at the start of a run

# microbenchmark key → roles it meets, and the precisions it applies to (None = every precision)
RUN_MEASUREMENTS = {
    "bf16_matmul": (("matrix", "attention", "scan"), ("bf16",)),
    "device_copy": (("memory",), None),
    "h2d_pinned": (("host_link",), None),
    "d2h_pinned": (("host_link",), None),
    "allreduce_busbw": (("interconnect",), None),  # measured by the launcher's rank 0 (several processes)
    "fp32_fma": (("vector",), None),  # FP32 multiply-adds in registers (compute-bound; GPU)
}
# microbenchmark key → roles it meets on the sustained basis, and its precisions
SUSTAINED_MEASUREMENTS = {
    "bf16_matmul_sustained": (("matrix", "attention", "scan"), ("bf16",)),
}


def with_measured_ceilings(spec: HwSpec, measured: Mapping[str, Mapping[str, Any]]) -> HwSpec:
    """`spec` plus the ceilings the harness measured on this machine at the start of the run.

    `measured` maps a microbenchmark (dohnuts_bench_plugins.analyzers.microbench: bf16_matmul,
    device_copy, h2d_pinned, d2h_pinned, fp32_fma) to {"value", "kind", "method", "date"}. Each
    becomes a measured ceiling `<key>_this_run` that takes its roles in `measured_roles`, replacing
    the file's measured numbers (this machine, now). The two pinned copies share the host-link
    role; the faster one is kept, since a bound must stay optimistic. Entries that are unknown,
    of the wrong kind or not a positive finite number are ignored: the basis then falls back to
    the file's measured ceilings, or to the datasheet. `bf16_matmul_sustained` (the matmul run back
    to back for seconds) becomes `bf16_matmul_sustained_this_run` in `sustained_roles`: the
    `sustained` basis (module docstring)."""
    return _with_measurements(spec, measured, suffix="_this_run", origin="measured at the start of this run")


def _with_measurements(spec: HwSpec, measured: Mapping[str, Mapping[str, Any]], *, suffix: str, origin: str) -> HwSpec:
    """`spec` with each known microbenchmark of `measured` as a measured ceiling `<key><suffix>` in
    its roles (RUN_MEASUREMENTS, SUSTAINED_MEASUREMENTS): it replaces a role's ceiling of another
    origin, and among its own kept the faster. Unknown or unusable entries are left out."""
    ceilings = dict(spec.ceilings)
    roles = {p: dict(t) for p, t in spec.measured_roles.items()}
    sustained = {p: dict(t) for p, t in spec.sustained_roles.items()}
    for key, entry in measured.items():
        if key not in RUN_MEASUREMENTS and key not in SUSTAINED_MEASUREMENTS or not isinstance(entry, Mapping):
            continue
        role_names, precisions = RUN_MEASUREMENTS.get(key) or SUSTAINED_MEASUREMENTS[key]
        kind = "compute" if role_names[0] in COMPUTE_ROLES else "bandwidth"
        value = entry.get("value")
        if (entry.get("kind", kind) != kind or isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value <= 0):
            continue
        name = f"{key}{suffix}"
        ceilings[name] = Ceiling(name=name, kind=kind, value=float(value), provenance="measured",
                                 source=f"{entry.get('method') or key} ({origin})",
                                 date=None if entry.get("date") is None else str(entry["date"]))
        for precision in [p for p in precisions or tuple(spec.roles) if p in spec.roles]:
            table = (sustained if key in SUSTAINED_MEASUREMENTS else roles).setdefault(precision, {})
            for role in role_names:
                current = ceilings.get(table.get(role, ""))
                if current is None or not current.name.endswith(suffix) or current.value < value:
                    table[role] = name
    return dataclasses.replace(spec, ceilings=ceilings, measured_roles=roles, sustained_roles=sustained)


def with_measured_section(spec: HwSpec, section: MeasuredSection) -> HwSpec:
    """`spec` with its file's `measured:` section (what `dohnuts-bench calibrate` measured on the
    device) as measured ceilings `<key>_calibrated`, in the roles a run's own measurement of the
    same microbenchmark takes (`with_measured_ceilings`): they replace the file's hand-written
    `measured_roles` entries, and a run's own measurements replace them in turn. Microbenchmarks
    that bound no role of a datasheet spec (the CPU's fp32_matmul, fp32_vector, host_copy) are
    kept as ceilings, in no role."""
    origin = f"dohnuts-bench calibrate on {section.device.strip()}, {section.date}"
    entries = {k: {"value": float(e.value), "kind": e.kind, "method": e.method.strip(), "date": e.date}
               for k, e in section.ceilings.items()}
    out = _with_measurements(spec, entries, suffix="_calibrated", origin=origin)
    ceilings = dict(out.ceilings)
    for key, e in entries.items():
        name = f"{key}_calibrated"
        if name not in ceilings:
            ceilings[name] = Ceiling(name=name, kind=e["kind"], value=e["value"], provenance="measured",
                                     source=f"{e['method']} ({origin})", date=str(e["date"]))
    return dataclasses.replace(out, ceilings=ceilings,
                               calibration={"date": str(section.date), "device": section.device.strip(),
                                            "method": section.method.strip()})


# --------------------------------------------------------------------------------------------
# A spec from measurements alone (a device without a datasheet spec: the CPU, an unknown GPU)

# microbenchmark key → roles it meets per precision (dohnuts_bench_plugins.analyzers.microbench)
SYNTHESIS = {
    "fp32_matmul": {"fp32": ("matrix", "attention", "scan")},
    "bf16_matmul": {"bf16": ("matrix", "attention", "scan")},
    "fp32_vector": {"fp32": ("vector",), "bf16": ("vector",)},
    "device_copy": {"fp32": ("memory",), "bf16": ("memory",)},
    "h2d_pinned": {"fp32": ("host_link",), "bf16": ("host_link",)},
    "d2h_pinned": {"fp32": ("host_link",), "bf16": ("host_link",)},  # the faster direction kept
    "host_copy": {"fp32": ("host_link",), "bf16": ("host_link",)},
    "allreduce_busbw": {"fp32": ("interconnect",), "bf16": ("interconnect",)},
    "fp32_fma": {"fp32": ("vector",), "bf16": ("vector",)},
}


def compute_kinds_overlap(device: Mapping[str, Any] | None) -> bool:
    """Whether a device no datasheet spec describes may run matrix and vector work at once, from its
    provenance (`dohnuts.bench.measure.provenance.device_info`: type, capability, hip, arch). A lower
    bound must hold on the device as it is, and the maximum of the kinds' times always does; their
    sum only where they share their units. So they are summed on a CPU (one thread runs them in turn
    on the same cores), on AMD's RDNA GPUs (gfx10 to gfx12: WMMA runs on the SIMDs' vector ALUs, as
    rx7900xtx.yaml says) and on NVIDIA GPUs without tensor cores (capability below 7.0); every other
    GPU — tensor cores or CDNA's matrix cores beside the vector pipes (h100.yaml, h200.yaml), or one
    its provenance does not describe — takes the maximum."""
    device = device if isinstance(device, Mapping) else {}
    if device.get("type") != "cuda":  # torch calls AMD GPUs cuda too; anything else runs on the CPU
        return False
    if device.get("hip"):
        arch = str(device.get("arch") or "")
        return not arch.startswith(("gfx10", "gfx11", "gfx12"))
    try:
        major = int(str(device.get("capability")).split(".")[0])
    except ValueError:
        return True  # a GPU whose capability was not recorded: the bound that holds on any GPU
    return major >= 7


def measured_hwspec(device_name: str, measured: Mapping[str, Mapping[str, Any]], *,
                    overlap_compute_kinds: bool = False) -> HwSpec | None:
    """A spec of this machine from the ceilings measured at the start of the run, when no datasheet
    spec names the device: measured roles only (reported as the `measured` basis, never as a
    datasheet), the compute kinds' times maximised or summed as `overlap_compute_kinds` says
    (`compute_kinds_overlap` of the run's device), and the sustained basis where the run measured
    the matmul back to back. A precision is covered only when every role has a ceiling; None when
    none is."""
    ceilings: dict[str, Ceiling] = {}
    roles: dict[str, dict[str, str]] = {}
    sustained_found: dict[str, str] = {}  # a matmul run back to back for seconds (a GPU run) → its ceiling
    for key, entry in measured.items():
        if key not in SYNTHESIS and key not in SUSTAINED_MEASUREMENTS or not isinstance(entry, Mapping):
            continue
        value = entry.get("value")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            continue
        first_role = SUSTAINED_MEASUREMENTS[key][0][0] if key in SUSTAINED_MEASUREMENTS else \
            next(iter(SYNTHESIS[key].values()))[0]
        name = f"{key}_this_run"
        ceilings[name] = Ceiling(name=name, kind="compute" if first_role in COMPUTE_ROLES else "bandwidth",
                                 value=float(value), provenance="measured",
                                 source=str(entry.get("method") or key) + " (measured at the start of this run)",
                                 date=None if entry.get("date") is None else str(entry["date"]))
        if key in SUSTAINED_MEASUREMENTS:
            sustained_found[key] = name
            continue
        for precision, role_names in SYNTHESIS[key].items():
            table = roles.setdefault(precision, {})
            for role in role_names:
                current = ceilings.get(table.get(role, ""))
                if current is None or current.value < value:  # a bound stays optimistic: the faster one
                    table[role] = name
    complete = {p: t for p, t in roles.items() if set(REQUIRED_ROLES) <= set(t)}
    if not complete:
        return None
    # The sustained basis, as a datasheet spec's run gets it (`with_measured_ceilings`): the roles
    # the sustained matmul meets; the others fall back to the measured ones.
    sustained: dict[str, dict[str, str]] = {}
    for key, name in sustained_found.items():
        role_names, precisions = SUSTAINED_MEASUREMENTS[key]
        for precision in (p for p in precisions if p in complete):
            sustained.setdefault(precision, {}).update({role: name for role in role_names})
    model = ("matrix and vector time maximised: units beside each other" if overlap_compute_kinds
             else "matrix and vector time added: units shared")
    return HwSpec(name=f"{device_name} (measured at run start, no datasheet spec)", ceilings=ceilings, roles={},
                  measured_roles=complete, sustained_roles=sustained, device_names=(device_name,), source=None,
                  overlap_compute_kinds=overlap_compute_kinds,
                  description=f"synthesised from the run's microbenchmarks ({model}); efficiency against them only")
