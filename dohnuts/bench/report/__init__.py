"""What a user reads: the text report (stdout and report.txt), the HTML page and its SVG charts,
the formats other tools read (`export`), the consoles (a user's string printed as text only) and
the status and progress lines on stderr. The tables and the roofline are drawn by
dohnuts.bench.analysis; the built-in reporter plugin (dohnuts_bench_plugins.reporters) draws the
plots.
"""
