"""What a run leaves behind and reads back: run directories, the run store (one SQLite file of
every run's records and summary), the history across revisions it holds, and summary.json and
run.json read typed.
"""
