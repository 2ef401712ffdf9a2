"""Bootstrap intervals of decode throughput and of throughput ratios between runs (torch-free).

A decode run's throughput is a ratio of sums over its requests (Eq. 10, as `specfit.results.metrics.stream_metrics`
computes it)::

    TPS_dec = (Σ n_output − n_requests) / Σ (t_request_s − t_prefill_s)

(each request's first output token comes from prefill). Its interval is a percentile bootstrap over requests:
resample the requests with replacement, recompute the ratio of sums, take the (1 − level)/2 and
(1 + level)/2 quantiles. The ratio of two runs' throughputs on the same prompts resamples request ids, the
same ids for both runs (a paired bootstrap), so that a prompt that is slow for both runs moves both
throughputs together instead of widening the interval.

Two runs timed in different processes also differ by what the machine did meanwhile, which resampling requests
cannot see. How much depends on the clock (``python -m specfit.bench spread`` measures a machine's):

- on an emulated device's virtual clock only the host work is measured, so the same jobs run twice move by the
  jitter of selection and route prediction: `VIRTUAL_SPREAD`, the standard deviation of the log ratio of the
  emulated A100's decode jobs run twice, one run beside other work (as ``bench spread`` prints it);
- a job whose every timing the CPU takes itself (a link-only emulation, or a CPU without a link) moves far more:
  `CPU_SPREAD`, measured over such job pairs on the wall-clock device;
- on a GPU the spread is not measured here; `PROCESS_SPREAD` stands for it (what jobs of an emulated device moved
  when it ran on the wall clock, before the virtual clock).

A ratio of two runs widens its interval by the spread between their processes (`process_spread`), in quadrature on
the log scale (``spread``).

Everything is deterministic for a given ``seed`` (one `numpy.random.Generator`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from statistics import NormalDist

import numpy as np

N_BOOT = 2000
LEVEL = 0.95
VIRTUAL_SPREAD = 0.0002  # sd of log(TPS run 2 / TPS run 1) of one decode job in two processes, virtual clock
PROCESS_SPREAD = 0.036  # the same for a GPU: what the wall-clock emulated device's jobs moved (see the docstring)
CPU_SPREAD = 0.10  # the same for a job whose timings the CPU takes itself (no device model)
CHUNK = 4_000_000  # resampled indices drawn at a time (bounds memory on streams of many requests)


def cpu_timed(metrics: Mapping) -> bool:
    """Whether a run's metrics.json comes from timings the CPU takes itself: no emulated device modelled them
    (``device``) and no GPU took them (a ``cuda`` timing label)."""
    return metrics.get("device") is None and not str(metrics.get("timing_label", "")).startswith("cuda")


def virtual(metrics: Mapping) -> bool:
    """Whether a run's metrics.json comes from an emulated device's virtual clock (its ``device`` record)."""
    return metrics.get("device") is not None


def process_spread(*metrics: Mapping) -> float:
    """The spread between processes of a ratio of runs with these metrics.json: `CPU_SPREAD` when any is CPU-timed,
    `VIRTUAL_SPREAD` when all are on a virtual clock, else `PROCESS_SPREAD`."""
    if any(cpu_timed(m) for m in metrics):
        return CPU_SPREAD
    return VIRTUAL_SPREAD if metrics and all(virtual(m) for m in metrics) else PROCESS_SPREAD


def decode_sums(requests: Iterable[Mapping]) -> tuple[np.ndarray, np.ndarray]:
    """Per request: decode tokens (n_output − 1) and decode seconds (t_request_s − t_prefill_s)."""
    rows = list(requests)
    tokens = np.asarray([r["n_output"] - 1 for r in rows], dtype=np.float64)
    seconds = np.asarray([r["t_request_s"] - r["t_prefill_s"] for r in rows], dtype=np.float64)
    return tokens, seconds


def _check(n_boot: int, level: float) -> None:
    if n_boot < 1:
        raise ValueError(f"n_boot must be at least 1, not {n_boot}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), not {level}")


def _resampled_sums(columns: list[np.ndarray], seed: int, n_boot: int) -> list[np.ndarray]:
    """Σ of each column over ``n_boot`` resamples (with replacement) of its rows, the same rows for every column."""
    n = len(columns[0])
    rng = np.random.default_rng(seed)
    sums = [np.empty(n_boot) for _ in columns]
    step = max(1, CHUNK // n)
    for start in range(0, n_boot, step):
        stop = min(n_boot, start + step)
        idx = rng.integers(0, n, size=(stop - start, n))  # [b, n] resampled rows
        for out, col in zip(sums, columns):
            out[start:stop] = col[idx].sum(axis=1)
    return sums


def _quantiles(samples: np.ndarray, level: float) -> tuple[float, float]:
    finite = samples[np.isfinite(samples)]
    if not len(finite):
        return float("nan"), float("nan")
    low, high = np.quantile(finite, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(low), float(high)


def _tps(tokens: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(seconds > 0, tokens / np.where(seconds > 0, seconds, 1.0), np.nan)


def tps_interval(requests: Iterable[Mapping], seed: int = 0, n_boot: int = N_BOOT, level: float = LEVEL) -> dict:
    """Decode TPS of a run and its percentile-bootstrap interval over requests.

    requests: rows of requests.parquet (``n_output``, ``t_request_s``, ``t_prefill_s``).
    Returns {"value", "low", "high", "n"}; with one request the interval is the value.
    """
    _check(n_boot, level)
    tokens, seconds = decode_sums(requests)
    n = len(tokens)
    if n == 0:
        raise ValueError("tps_interval needs at least one request")
    total = seconds.sum()
    if not total > 0:
        raise ValueError(f"the requests' total decode time is {total} s: no decode throughput")
    value = float(tokens.sum() / total)
    if n == 1:
        return {"value": value, "low": value, "high": value, "n": 1}
    boot_tokens, boot_seconds = _resampled_sums([tokens, seconds], seed, n_boot)
    low, high = _quantiles(_tps(boot_tokens, boot_seconds), level)
    return {"value": value, "low": low, "high": high, "n": n}


def verdict(low: float, high: float) -> str:
    """"faster" when the whole interval lies above 1, "slower" when below, else "tie"."""
    if low > 1.0:
        return "faster"
    if high < 1.0:
        return "slower"
    return "tie"


def _by_id(requests: Iterable[Mapping], which: str) -> dict:
    out = {}
    for r in requests:
        rid = r["request_id"]
        if rid in out:
            raise ValueError(f"request_id {rid} appears twice in the {which} run")
        out[rid] = r
    return out


def ratio_interval(num_requests: Iterable[Mapping], den_requests: Iterable[Mapping], seed: int = 0,
                   n_boot: int = N_BOOT, level: float = LEVEL, spread: float = 0.0) -> dict:
    """TPS_dec(num) / TPS_dec(den) on the request ids both runs hold, with a paired percentile bootstrap.

    Each resample draws request ids with replacement and recomputes both runs' throughputs on those ids.
    ``spread``: the standard deviation of the log ratio between the two runs' processes (`process_spread`; 0: none),
    added to each side's log half-width in quadrature at the interval's level.
    Returns {"value", "low", "high", "n", "verdict"}: verdict "faster" when low > 1, "slower" when
    high < 1, else "tie". With one common request the interval is the value, widened by ``spread``.
    """
    return products_ratio_interval([num_requests], [den_requests], seed, n_boot, level, spread)


def products_ratio_interval(num: list[Iterable[Mapping]], den: list[Iterable[Mapping]], seed: int = 0,
                            n_boot: int = N_BOOT, level: float = LEVEL, spread: float = 0.0) -> dict:
    """Π TPS_dec(num runs) / Π TPS_dec(den runs) (each run its requests) on the request ids every run holds: the
    paired bootstrap and ``spread`` of `ratio_interval`, which is the case of one run on each side. A ratio of two
    ratios, (a / b) / (c / d), is [a, d] over [b, c]: how much a gain at one cache size exceeds the gain at another,
    with the same ids drawn for all four runs."""
    _check(n_boot, level)
    one = len(num) == len(den) == 1  # errors name the runs "numerator", "denominator" (else "numerator 1", ...)
    names = [f"{side}{'' if one else f' {j + 1}'}" for side, runs in (("numerator", num), ("denominator", den))
             for j in range(len(runs))]
    runs = [_by_id(rows, name) for name, rows in zip(names, (*num, *den))]
    ids = sorted(set.intersection(*(set(r) for r in runs)))
    if not ids:
        raise ValueError(f"a ratio needs requests present in {'both' if len(runs) == 2 else 'all'} runs "
                         f"({' and '.join(str(len(r)) for r in runs)} requests, no request_id in common)")
    sums = [decode_sums(r[i] for i in ids) for r in runs]  # per run: [ids] tokens, [ids] seconds
    tps = [_tps(tokens.sum(), seconds.sum()) for tokens, seconds in sums]
    top, bottom = math.prod(tps[:len(num)]), math.prod(tps[len(num):])
    if not all(np.isfinite(x) for x in tps) or bottom == 0:
        shown = " over ".join(" * ".join(str(float(x)) for x in side) for side in (tps[:len(num)], tps[len(num):]))
        raise ValueError(f"no ratio: decode TPS {shown} on {len(ids)} common requests")
    value = float(top / bottom)
    n = len(ids)
    if n == 1:
        low = high = value
    else:
        resampled = _resampled_sums([col for run in sums for col in run], seed, n_boot)
        boot = [_tps(resampled[2 * j], resampled[2 * j + 1]) for j in range(len(runs))]  # [n_boot] per run
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            low, high = _quantiles(math.prod(boot[:len(num)]) / math.prod(boot[len(num):]), level)
    if spread > 0 and low > 0:
        z = float(NormalDist().inv_cdf((1.0 + level) / 2.0))
        down, up = np.log(value / low), np.log(high / value)  # the bootstrap's log half-widths
        low = value * float(np.exp(-np.hypot(down, z * spread)))
        high = value * float(np.exp(np.hypot(up, z * spread)))
    return {"value": value, "low": low, "high": high, "n": n, "verdict": verdict(low, high)}
