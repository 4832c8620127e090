"""dohnuts-bench's analysis core: hardware specs, the analytic cost model, bounds, the critical
path over the call pipeline, and reports over raw JSONL records.

    spec = find_hwspec("rx7900xtx")                      # or load_hwspec("my_gpu.yaml")
    analysis = analyze_records(read_records("results/run.jsonl"), spec)
    print_analysis(analysis)                             # rich tables
    roofline_png(analysis, "results/roofline.png")

Modules: hwspec (YAML ceilings with their derivation), flops (counting rules), cost (stage costs
of one call from its WorkCounts), bounds (T_lower, efficiency, verdict), critical_path (the
pipeline model), records (the record type, its reader, writer and migration), report (analyze_records),
render (tables), roofline (the
one roofline drawing: PNG and HTML), quantiles (the one quantile method, mean and deviation),
headline (the table that opens every report: dohnuts against its peer and against the bound).
"""

from dohnuts.bench.analysis.bounds import CallBounds, StageBound, combine, efficiency, stage_bound, target_verdict
from dohnuts.bench.analysis.cost import StageCost, Work, call_totals, fold_stages, stage_costs, token_counts
from dohnuts.bench.analysis.critical_path import CallGraph, Dependency, default_call_graph
from dohnuts.bench.analysis.flops import LoraShape
from dohnuts.bench.analysis.hwspec import Ceiling, HwSpec, find_hwspec, load_hwspec, parse_hwspec
from dohnuts.bench.analysis.records import CallRecord, RecordError, RecordWarning, read_jsonl, read_records
from dohnuts.bench.analysis.render import analysis_tables, call_table, print_analysis, stage_table
from dohnuts.bench.analysis.roofline import roofline_png
from dohnuts.bench.analysis.report import Analysis, CallRow, GroupAnalysis, StageRow, analyze_records

__all__ = [
    "Analysis", "CallBounds", "CallRecord", "CallGraph", "CallRow", "Ceiling", "Dependency", "GroupAnalysis", "HwSpec",
    "LoraShape", "RecordError", "RecordWarning", "StageBound", "StageCost", "StageRow", "Work",
    "analysis_tables", "analyze_records", "call_table", "call_totals", "combine", "default_call_graph",
    "efficiency", "find_hwspec", "fold_stages", "load_hwspec", "parse_hwspec", "print_analysis",
    "read_jsonl", "read_records", "roofline_png", "stage_bound", "target_verdict", "stage_costs", "stage_table",
    "token_counts",
]
