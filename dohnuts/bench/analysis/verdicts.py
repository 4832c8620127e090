"""The words of a comparison's verdict, one place for all who compare (dohnuts.bench.analysis.compare,
its load rule dohnuts.bench.analysis.load_verdict, the gates, the history)."""

FASTER = "faster"
SLOWER = "slower"
NO_CHANGE = "no detectable change"
TOO_FEW = "too few calls"
UNDEFINED = "ratio undefined (one median is 0)"
