"""The soak run's figures (``bench.soak``): every series sampled on a clock, each one's trend
after warm-up, the latency quantiles read off the processes' Prometheus histograms, and the
plot of it all.

A series **drifts** when, after warm-up, its least-squares slope is told apart from zero
(its 95% interval excludes it) *and* what that slope adds over the window is more than
``tolerance`` (10%) of the series' level: noise around a level passes, a steady climb does not,
however small its steps. A process restarted by a fault starts a new segment of its series;
the longest segment after warm-up is the one judged (a restarted process is a new process), and
the samples taken while the system recovered from a fault are left out.
"""

from __future__ import annotations

import csv
import math
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Series:
    """One figure over time: (seconds since the start, value) points, in segments (a new
    segment where its process was started again)."""

    name: str
    group: str
    segments: list[list[tuple[float, float]]] = field(default_factory=lambda: [[]])

    def add(self, at: float, value: float) -> None:
        self.segments[-1].append((at, value))

    def restart(self) -> None:
        if self.segments[-1]:
            self.segments.append([])

    @property
    def points(self) -> list[tuple[float, float]]:
        return [p for segment in self.segments for p in segment]


class Samples:
    """Every series of a run, by name."""

    def __init__(self) -> None:
        self.series: dict[str, Series] = {}

    def add(self, at: float, group: str, name: str, value: float) -> None:
        self.series.setdefault(name, Series(name, group)).add(at, value)

    def restart(self, prefix: str) -> None:
        """The process whose series start with ``prefix`` was started again."""
        for series in self.series.values():
            if series.name.startswith(prefix):
                series.restart()

    def write_csv(self, path: Path) -> None:
        with path.open("w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(["series", "group", "seconds", "value"])
            for s in self.series.values():
                for at, value in s.points:
                    writer.writerow([s.name, s.group, f"{at:.1f}", f"{value:g}"])


@dataclass(frozen=True)
class Trend:
    """A series after warm-up: its level (mean), what its slope adds over the window (as a
    share of the level), and whether that is a drift."""

    name: str
    level: float
    growth: float
    significant: bool
    drifts: bool


def trend(
    name: str, points: Sequence[tuple[float, float]], tolerance: float, floor: float
) -> Trend:
    """The least-squares trend of ``points``; ``floor`` is the least level a share is taken
    of (a series near zero — dead tuples after a vacuum — is judged against it)."""
    n = len(points)
    if n < 5:
        return Trend(name, math.nan, 0.0, False, False)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    residuals = [y - (my + slope * (x - mx)) for x, y in zip(xs, ys, strict=True)]
    spread = math.sqrt(sum(r * r for r in residuals) / (n - 2)) if n > 2 else 0.0
    stderr = spread / math.sqrt(sxx) if sxx else 0.0
    significant = abs(slope) > 1.96 * stderr and slope != 0
    window = xs[-1] - xs[0]
    growth = slope * window / max(abs(my), floor)
    return Trend(name, my, growth, significant, significant and growth > tolerance)


def trends(
    samples: Samples,
    after: float,
    tolerance: float = 0.10,
    floors: dict[str, float] | None = None,
    recovering: Sequence[tuple[float, float]] = (),
) -> list[Trend]:
    """Each series' trend over its longest segment after ``after`` seconds, the samples taken
    while the system recovered from a fault (``recovering``: spans of seconds) left out: a
    Redis restarted empty refills for a result TTL, and that is no drift."""

    def steady(at: float) -> bool:
        return at >= after and not any(start <= at < end for start, end in recovering)

    found = []
    for s in samples.series.values():
        kept = [[p for p in seg if steady(p[0])] for seg in s.segments]
        longest = max(kept, key=len, default=[])
        floor = next((v for k, v in (floors or {}).items() if s.name.startswith(k)), 1.0)
        found.append(trend(s.name, longest, tolerance, floor))
    return found


# -- latency from Prometheus histograms --------------------------------------------------------


def scrape(port: int) -> str:
    """A process's /metrics text ('' when it does not answer: restarted, or paused)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            return str(answer.read().decode())
    except OSError:
        return ""


# The key under which :func:`buckets` keeps a histogram's sum of observations beside its
# buckets' upper bounds (which are never negative), so that a delta or a total carries it.
SUM = -1.0


def buckets(text: str, metric: str, **labels: str) -> dict[float, float]:
    """The cumulative bucket counts (upper bound → count) of ``metric`` with ``labels``, and
    the sum of its observations (under ``SUM``)."""
    found: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if any(sample.labels.get(k) != v for k, v in labels.items()):
                continue
            if sample.name == metric + "_bucket":
                found[float(sample.labels["le"])] = sample.value
            elif sample.name == metric + "_sum":
                found[SUM] = sample.value
    return found


def delta(now: dict[float, float], before: dict[float, float]) -> dict[float, float]:
    """What a histogram counted between two scrapes (all of ``now`` if the process restarted
    meanwhile: its counts went down)."""
    if any(now.get(le, 0) < count for le, count in before.items()):
        return dict(now)
    return {le: count - before.get(le, 0) for le, count in now.items()}


def add(total: dict[float, float], more: dict[float, float]) -> None:
    for le, count in more.items():
        total[le] = total.get(le, 0) + count


def quantile(cumulative: dict[float, float], q: float) -> float | None:
    """The ``q`` quantile of cumulative bucket counts, interpolated in its bucket as
    Prometheus' ``histogram_quantile`` does (None with nothing counted)."""
    bounds = sorted(le for le in cumulative if le != SUM)
    if not bounds or cumulative[bounds[-1]] <= 0:
        return None
    rank = q * cumulative[bounds[-1]]
    lower, below = 0.0, 0.0
    for le in bounds:
        count = cumulative[le]
        if count >= rank:
            if math.isinf(le):
                return lower
            inside = count - below
            return lower + (le - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = le, count
    return lower


def mean(counted: dict[float, float]) -> float | None:
    """The mean of the observations a histogram counted, exact (its sum over its count): None
    with nothing counted."""
    count = counted.get(math.inf, 0.0)
    return counted.get(SUM, 0.0) / count if count > 0 else None


# -- processes -------------------------------------------------------------------------------


def process_figures(pid: int) -> dict[str, float]:
    """A process's memory (RSS, MiB), threads, open files and connections."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            return {
                "rss_mib": proc.memory_info().rss / 2**20,
                "threads": float(proc.num_threads()),
                "files": float(proc.num_fds()),
                "connections": float(len(proc.net_connections(kind="all"))),
            }
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return {}


# -- the plot ----------------------------------------------------------------------------------


def plot(samples: Samples, path: Path, warmup: float, marks: Iterable[tuple[float, str]]) -> None:
    """One panel per group of series, the warm-up shaded and each fault marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[Series]] = {}
    for s in samples.series.values():
        groups.setdefault(s.group, []).append(s)
    fig, axes = plt.subplots(len(groups), 1, figsize=(11, 2.6 * len(groups)), sharex=True)
    faults = list(marks)
    for ax, (group, members) in zip(
        list(getattr(axes, "flat", [axes])), groups.items(), strict=True
    ):
        for s in members:
            for i, segment in enumerate(s.segments):
                if segment:
                    ax.plot(
                        [p[0] / 60 for p in segment],
                        [p[1] for p in segment],
                        label=s.name if i == 0 else None,
                        linewidth=1,
                    )
        ax.axvspan(0, warmup / 60, color="0.9")
        for at, _ in faults:
            ax.axvline(at / 60, color="0.6", linewidth=0.5, linestyle=":")
        ax.set_title(group, fontsize=9, loc="left")
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, loc="upper left", ncol=4)
    fig.axes[-1].set_xlabel("minutes (warm-up shaded, faults dotted)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
