"""Calibration: one temperature T for the probabilities softmax(s / T).

Fitted after LoRA merge, on a partition used for nothing else, by minimising the negative
log-likelihood of the correct candidates. NLL is convex in 1/T, so a golden-section search over
log T in [0.05, 20] finds the optimum; test and benchmark scores never tune it.
"""

from __future__ import annotations

import math

import torch


def nll(logits: torch.Tensor, correct: torch.Tensor, temperature: float) -> float:
    """logits (Q, K) with −inf padding, correct (Q,) index → mean NLL at temperature T."""
    return float(torch.nn.functional.cross_entropy(logits.double() / temperature, correct))


def fit_temperature(logits: torch.Tensor, correct: torch.Tensor, lo: float = 0.05, hi: float = 20.0,
                    iters: int = 60) -> float:
    a, b = math.log(lo), math.log(hi)
    phi = (math.sqrt(5) - 1) / 2
    c, d = b - phi * (b - a), a + phi * (b - a)
    fc, fd = nll(logits, correct, math.exp(c)), nll(logits, correct, math.exp(d))
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - phi * (b - a)
            fc = nll(logits, correct, math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + phi * (b - a)
            fd = nll(logits, correct, math.exp(d))
    return math.exp((a + b) / 2)


def expected_calibration_error(probs: torch.Tensor, correct: torch.Tensor, bins: int = 10) -> float:
    """ECE of the chosen candidate's probability (probs (Q, K), correct (Q,))."""
    conf, choice = probs.max(dim=-1)
    hit = (choice == correct).double()
    edges = torch.linspace(0, 1, bins + 1)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (conf > lo) & (conf <= hi)
        if m.any():
            ece += float(m.double().mean() * (conf[m].double().mean() - hit[m].mean()).abs())
    return ece
