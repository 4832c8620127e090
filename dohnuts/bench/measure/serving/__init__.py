"""Serving scenarios: requests arriving over time into a target, as a server sees them.

A workload's `scenario` (dohnuts.bench.measure.serving.config) picks how its calls are issued, after the
single calls every scenario keeps (they give the per-stage bounds):

    single    (default) the single calls, and beside them a pipelined stream: what the harness
              always measured
    stream    the pipelined stream alone as the scenario, sized by its minimums (MLPerf
              LoadGen's SingleStream issues one query after another; the stream is the same
              back-to-back order with the pipeline's overlap)
    server    requests arrive at a seeded Poisson rate (bursty: gamma gaps; or at the times of a
              trace) into a bounded queue in front of the target (LoadGen's Server), or from N
              closed-loop clients that each send again when answered (vLLM's max-concurrency);
              per request its arrival, start, first byte and completion; fixed rates or client
              counts and/or a search for the highest rate (or the most clients) whose latency
              percentile stays under an SLO
    offline   the whole set handed over at once (LoadGen's Offline): throughput

Modules: arrivals (Poisson, bursty and trace schedules, the closed loop), clock (the real clock and a simulated one),
server (the bounded queue, the closed loop's, and the one-at-a-time server over `run_call`), pipelined (the dohnuts
pipelined predictor as a server), stats (percentiles with their intervals, a load point's
summary), queueing (M/D/1 arithmetic), search (the SLO search), config (the workload fields),
scenario (the run loop's side: points → records).
"""
