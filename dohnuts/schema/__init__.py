"""Every file the project reads or writes: typed decoding with one-line errors, strict YAML, strict JSON,
user paths checked before they are opened, JSONL written whole records at a time.

One import point (`from dohnuts.schema import ...`) over seven small modules: `decode` (msgspec
conversion and its errors), `strict_yaml`, `strict_json`, `user_files` (a path a user names:
refused by type and size before any read), `jsonl_file` (records written whole or not at all), `output_paths` (the one rule for where a
command may write) and
`values` (helpers for messages and numbers). Every reader of the project uses it: workloads (dohnuts.bench.measure.workload and the kinds'
`Shape`s), hwspecs (dohnuts.bench.analysis.hwspec_file), benchmark records
(dohnuts.bench.analysis.records), run.json (dohnuts.bench.store.summary_file), requests
(dohnuts.runtime.requests), model configs and config.json (dohnuts.config, dohnuts.hf_config), adapter
metadata (dohnuts.adapters), the training config (dohnuts.train.config) and checkpoint manifests
(dohnuts.train.checkpoints).

Readers declare what a file holds as msgspec Structs (types, `msgspec.Meta` bounds, and
`__post_init__` checks that raise `Invalid`); `convert` and `decode_json` turn whatever msgspec
refuses into the project's one error line, `FILE: field 'PATH': problem` (`DohnutsError`, with
`source` the file and `field` the path msgspec reports, e.g. `shape.seq_tokens`,
`questions[0].candidates`, `ceilings.mm.factors.clock_hz`). `integer_in(lo, hi)` and `number_in(...)`
declare a bounded field whose refusal reads `must be an integer in lo..hi, got X`; `check_fields(self)`,
first in a `__post_init__`, holds a Struct built in code to its declaration as decoding would.

    class Shape(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
        questions: Annotated[int, Meta(ge=1, le=4096)] = 8
    shape = convert(data, Shape, source="w.yaml", prefix="shape")

Also here, because every reader and writer shares them: `read_yaml` (refuses duplicate keys, one
line for every YAML failure), `read_json` (a user's JSON file, bounded and checked by its stat),
`dumps` / `write_json` (the one strict-JSON writer: never a bare NaN or Infinity), and the small
helpers their checks use (`short`, `one_line`, `printable`, `why_not_finite`, `first_nonfinite`, `median`).
"""

from dohnuts.schema.decode import (
    MAX_FLOAT, Finite, Invalid, NonBlank, NonNegative, Positive, check_fields, convert, decode_json, integer_in,
    number_in, problem, read_json,
)
from dohnuts.schema.jsonl_file import JsonlFile, append_line
from dohnuts.schema.output_paths import check_output_file, check_output_folder, is_run_folder, same_file
from dohnuts.schema.strict_json import dumps, json_safe, write_bytes_atomic, write_json, write_text_atomic
from dohnuts.schema.strict_yaml import DuplicateKeyError, StrictLoader, read_yaml, yaml_error
from dohnuts.schema.user_files import (
    GIB, KIB, MIB, check_dir, check_file, check_output, kind_of, open_file, read_file, size_words, stat_path,
)
from dohnuts.schema.values import (
    first_nonfinite, is_finite, median, one_line, one_line_error, printable, printable_lines, short, why_not_finite,
)

__all__ = [
    "GIB", "KIB", "MIB", "JsonlFile", "append_line", "check_dir", "check_file", "check_output", "kind_of",
    "open_file", "read_file", "size_words", "stat_path",
    "MAX_FLOAT", "DuplicateKeyError", "Finite", "Invalid", "NonBlank", "NonNegative", "Positive", "StrictLoader",
    "check_fields", "convert", "integer_in", "number_in", "decode_json", "dumps", "first_nonfinite", "is_finite", "json_safe", "median", "one_line",
    "one_line_error", "printable", "printable_lines", "problem", "read_json", "read_yaml", "short",
    "why_not_finite", "write_json", "write_bytes_atomic", "write_text_atomic", "yaml_error",
    "check_output_file", "check_output_folder", "is_run_folder", "same_file",
]
