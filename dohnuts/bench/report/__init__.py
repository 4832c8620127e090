"""What a user reads: the HTML page and its SVG charts, the consoles (a user's string printed as
text only) and the status and progress lines on stderr. The text report is the built-in reporter
plugin's (dohnuts_bench_plugins.reporters); the tables and the roofline are drawn by
dohnuts.bench.analysis.
"""
