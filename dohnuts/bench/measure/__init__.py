"""Measuring: workload files read into specifications, the run loop, one call timed per stage
(`call.py`), its record, the telemetry sampled meanwhile, where the numbers came from
(provenance, the machine's id), the reference check, profiler traces, the processes of a
launched run (`worker.py`) and of the interleaved gate, and served scenarios (`serving/`).
"""
