"""`dohnuts-bench calibrate`: measure this device's ceilings and write them into the `measured:`
section of a copy of its hwspec — the first half of the run kit (benchmarks/card_kit.sh: calibrate,
then the standard suite against the copy).

The measurements are the ones every run takes at its start, through the same hook
(`dohnuts_bench_prepare_run`; bench_plugins/analyzers/microbench.py): on a GPU a BF16 matmul as a
burst and back to back for 2 s (the sustained basis), FP32 multiply-adds in registers, a device
copy and pinned host↔device copies; on the CPU (the kit's dry run) FP32/BF16 matmuls, an FP32
vector multiply-add, a memory copy. So the calibrated section and a run's own measured basis mean
the same thing. The copy keeps the spec's text as it is — the datasheet ceilings, their sources
and comments — and only its `measured:` section is written (replaced when there is one); it is
validated before it is written, atomically. `--write` may name the spec itself.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path

import yaml
from rich.table import Table
from rich.text import Text

from dohnuts.bench import plugins
from dohnuts.bench.analysis.hwspec import hwspec_for_device, parse_hwspec
from dohnuts.bench.commands.options import add_hwspec
from dohnuts.bench.contracts import RunContext
from dohnuts.bench.measure.telemetry import TelemetryThread
from dohnuts.bench.plugins import samplers
from dohnuts.bench.report.terminal import stdout_console
from dohnuts.errors import ConfigError
from dohnuts.schema import check_output_file, read_yaml, write_text_atomic
from dohnuts.schema.strict_yaml import StrictLoader, yaml_error

METHOD = "dohnuts-bench calibrate (the run-start microbenchmarks, bench_plugins/analyzers/microbench.py)"
# A top-level `measured:` block: its key line and every line after it up to the next top-level key.
_SECTION = re.compile(r"^measured:.*?(?=^[^\s#]|\Z)", re.M | re.S)
_NOTE = "# Measured on the device by `dohnuts-bench calibrate`; the datasheet ceilings above stay as they are.\n"


def setup_arguments(subparsers) -> None:
    c = subparsers.add_parser("calibrate",
                              help="measure this device's ceilings into the measured: section of a hwspec copy")
    add_hwspec(c, default="the built-in that names this device",
               what="the spec to copy: a built-in name (rx7900xtx, h200) or a path")
    c.add_argument("--write", required=True, metavar="OUT.yaml",
                   help="where the copy goes (required, no default; its folder is created; the spec's own path replaces "
                        "its measured: section)")
    c.set_defaults(func=run)


def with_measured_section(text: str, section: dict) -> str:
    """The YAML text of a spec with its top-level `measured:` section replaced by `section` (or
    appended): every other line, comment and number stays as it was."""
    body = _SECTION.sub("", text).replace(_NOTE, "").rstrip("\n")
    plain = json.loads(json.dumps(section, default=str))  # YAML-safe: tuples as lists, anything odd as text
    dumped = yaml.safe_dump({"measured": plain}, sort_keys=False, width=110, allow_unicode=True)
    return f"{body}\n\n{_NOTE}{dumped}"


def measure(device, console) -> dict:
    """The run-start measurements of `device`, through the prepare hook (dohnuts_bench_plugins.analyzers)."""
    with tempfile.TemporaryDirectory(prefix="dohnuts-calibrate-") as tmp:
        run = RunContext(run_id="calibrate", run_dir=Path(tmp), device=device, hwspec=None, console=console)
        plugins.plugin_manager().hook.dohnuts_bench_prepare_run(run=run)
    ceilings = run.measured.get("ceilings") or {}
    if not ceilings:
        raise ConfigError("no plugin measured any ceiling (dohnuts_bench_prepare_run)", source="dohnuts-bench calibrate")
    return ceilings


def section_for(device, ceilings: dict, facts: dict) -> dict:
    """The `measured:` section (dohnuts.bench.analysis.hwspec_file.MeasuredSection) of these
    measurements: each with its value, kind, unit, method and date, and where they came from."""
    # imports torch: only once the command line's checks have passed (they run before torch)
    from dohnuts.bench.measure.provenance import device_info, git_revision, package_versions

    packages = {k: v for k, v in package_versions().items() if v != "absent"}
    return {
        "date": time.strftime("%Y-%m-%d"),
        "device": device_info(device)["name"],
        "method": METHOD,
        "provenance": {"git": git_revision(), "packages": packages, "device": device_info(device), "gpu": facts},
        "ceilings": {key: {"value": float(f"{e['value']:.6g}"), "kind": e["kind"], "unit": e.get("unit"),
                           "method": str(e.get("method") or key), "date": str(e.get("date") or time.strftime("%Y-%m-%d"))}
                     for key, e in ceilings.items()},
    }


def run(args) -> int:
    # imports torch: only once the command line's checks have passed (they run before torch)
    import torch

    # imports torch: only once the command line's checks have passed (they run before torch)
    from dohnuts.bench.measure.provenance import device_info

    console = stdout_console()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    name = device_info(device)["name"]
    spec = hwspec_for_device(args.hwspec, name)
    if spec is None:
        raise ConfigError(f"no built-in hwspec names this device ({name!r}): give --hwspec NAME or a path",
                          source="command line", field="--hwspec")
    out = Path(args.write)
    if out.is_dir() or out.suffix not in (".yaml", ".yml"):
        raise ConfigError("must be a .yaml file path", source="command line", field="--write")
    # the one output rule (dohnuts.schema.output_paths), before anything is measured; the spec it copies
    # may be named (its measured: section is replaced, the rest kept), so it is not counted an input here
    check_output_file(out, field="--write", what="a YAML file to write", error=ConfigError, make_folder="later")
    if not spec.matches(name):

        console.print(Text.assemble(("note", "yellow"), f": {spec.name} does not describe this device ({name}); its "
                                    "copy gets this device's measurements (a dry run)"))
    text = Path(spec.source).read_text(encoding="utf-8")
    ceilings = measure(device, console)
    telemetry = TelemetryThread([s for s in samplers(plugins.plugin_manager()) if not s.unavailable])
    section = section_for(device, ceilings, telemetry.device_facts())
    new = with_measured_section(text, section)
    checked = parse_hwspec(parse_text(new, str(out)), source=str(out))  # a valid spec, or nothing is written
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot be written ({exc.strerror or exc})", source=str(out)) from None
    write_text_atomic(out, new, error=ConfigError)  # a link planted meanwhile is replaced, never followed
    read_yaml(out)  # what was written reads back
    _print(console, checked, section, out)
    return 0


def parse_text(text: str, source: str):
    """`text` parsed as dohnuts.schema.read_yaml parses a file (a duplicate key refused)."""
    try:
        return yaml.load(text, Loader=StrictLoader)
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        raise yaml_error(exc, source) from None


def _print(console, spec, section: dict, out: Path) -> None:
    """Each measurement beside the datasheet ceiling of the role it bounds."""
    t = Table(title=f"{section['device']}: measured into {out}")
    for col in ("measurement", "value", "datasheet ceiling of its role", "fraction"):
        t.add_column(col)
    for key, e in section["ceilings"].items():
        unit = "FLOP/s" if e["kind"] == "compute" else "B/s"
        role = next(((p, r) for p, table in spec.measured_roles.items() for r, n in table.items()
                     if n == f"{key}_calibrated"), None)
        if key == "bf16_matmul_sustained":
            role = ("bf16", "matrix")
        sheet = spec.ceiling(role[1], role[0]) if role and role[0] in spec.roles else None
        t.add_row(key, f"{e['value']:.4g} {unit}", f"{sheet.name} {sheet.value:.4g} {unit}" if sheet else "— (no role)",
                  f"{e['value'] / sheet.value:.1%}" if sheet else "—")
    console.print(t)
    console.print(f"next: dohnuts-bench run --hwspec {out}")
