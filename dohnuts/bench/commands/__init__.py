"""The commands of `dohnuts-bench`, one module a subcommand (`run`, `analyze`, `compare`, `list`,
`history`, `store`, `baseline`, `gate`, `report`, `calibrate`, `export`, `schema`).

Each reads its command line, calls the measure, analysis, report and store packages, and returns
the exit status; dohnuts.bench.cli is the program's entry point.
"""
