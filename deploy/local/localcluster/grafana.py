"""The chart's Grafana dashboard, its queries as Grafana sends them, run by Prometheus' engine.

Grafana interpolates a panel's query before it reaches Prometheus: template variables become
the values selected (regex-escaped and joined with `|` for a multi-value variable, its
`allValue` as is for "All"), and the built-ins `$__interval`, `$__rate_interval` and `$__range`
durations computed from the time range and the data source's scrape interval. `substitute`
does the same (Grafana's Prometheus data source, `interpolateQueryExpr` and the
`$__rate_interval` rule of its documentation). `evaluate` runs the results with promeval
(deploy/local/promqlbin), Prometheus' own parser and engine over scraped exposition text.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from dra.daemon import metrics
from localcluster.binaries import ensure_promeval

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "helm" / "dra-gpu" / "dashboards" / "dra-gpu.json"

#: What prometheus_client answers a scrape without OpenMetrics in its Accept header.
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"

#: Selected for a variable: its values, or ALL.
ALL = "$__all"

#: dcgm-exporter's series, which panels join with dra_gpu_claim_device_info; not the project's.
DCGM_PREFIX = "DCGM_"

#: The usage series of issue 27 item 3 (dra.kubeletplugin.usage): the dashboard has a panel for each.
USAGE_SERIES = frozenset(
    {
        "dra_gpu_claim_memory_used_bytes",
        "dra_gpu_claim_utilization_ratio",
        "dra_gpu_claim_busy_seconds_total",
        "dra_gpu_unattributed_memory_used_bytes",
        "dra_gpu_unattributed_utilization_ratio",
        "dra_gpu_usage_series_dropped_total",
        "dra_gpu_usage_sample_duration_seconds_bucket",
    }
)

#: The sample names of each metric type, after the family's name (prometheus_client's families
#: drop a counter's _total).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
}

_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>[A-Za-z_]\w*)\)$")
_VARIABLE = re.compile(r"\$(?P<plain>\w+)|\$\{(?P<braced>\w+)\}")
# Grafana's prometheusSpecialRegexEscape: RE2's metacharacters, each behind an escaped backslash.
_REGEX_SPECIAL = re.compile(r"[$^*{}\[\]'+?.()|]")


@dataclass(frozen=True)
class Panel:
    """One query of one panel."""

    title: str
    expr: str


@dataclass(frozen=True)
class Variable:
    """A query variable: `label_values(selector, label)`."""

    name: str
    selector: str
    label: str
    multi: bool
    include_all: bool
    all_value: str | None


@dataclass(frozen=True)
class Scrape:
    """One target's /metrics answer at one time, with the labels service discovery gives the target."""

    target: Mapping[str, str]
    time_ms: int
    text: str
    content_type: str = TEXT_FORMAT


@dataclass(frozen=True)
class Answer:
    """promeval's answer to one expression."""

    expr: str
    #: The expression is not PromQL.
    parse_error: str
    #: It parsed but did not evaluate (e.g. many-to-many matching).
    error: str
    #: The metric names its selectors name.
    metrics: tuple[str, ...]
    #: Each series of the range result: its labels, number of points and last value.
    series: tuple[Mapping[str, Any], ...] = field(default=())


def _sample_names(family: Metric) -> set[str]:
    return {family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",))}


def exported_names() -> frozenset[str]:
    """Every sample name the project's daemons export, whether a series exists now or not."""
    registries = (
        metrics.REGISTRY,
        metrics.DEVICE_PLUGIN_REGISTRY,
        metrics.LABELLER_REGISTRY,
        metrics.WEBHOOK_REGISTRY,
    )
    return frozenset(name for registry in registries for f in registry.collect() for name in _sample_names(f))


def exposition_names(text: str) -> frozenset[str]:
    """The sample names that have series in a /metrics answer."""
    return frozenset(s.name for f in text_string_to_metric_families(text) for s in f.samples)


def unknown_metrics(answer: Answer, exposed: frozenset[str] = frozenset()) -> list[str]:
    """The metric names a query names that neither the project (nor `exposed`) nor DCGM has."""
    known = exported_names() | exposed
    return [m for m in answer.metrics if m not in known and not m.startswith(DCGM_PREFIX)]


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    """The dashboard JSON."""
    dashboard: dict[str, Any] = json.loads(path.read_text())
    return dashboard


def _panels(panels: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for panel in panels:
        yield panel
        # A collapsed row keeps its panels inside it.
        yield from _panels(panel.get("panels") or [])


def panel_queries(dashboard: Mapping[str, Any]) -> list[Panel]:
    """Every query of every panel, rows' panels included, in dashboard order."""
    return [
        Panel(panel["title"], target["expr"])
        for panel in _panels(dashboard.get("panels") or [])
        for target in panel.get("targets") or []
    ]


def variables(dashboard: Mapping[str, Any]) -> list[Variable]:
    """The dashboard's query variables; any other query than label_values(selector, label) is an error."""
    found = []
    for variable in dashboard.get("templating", {}).get("list") or []:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, Mapping) else query
        match = _LABEL_VALUES.match(text.strip())
        if match is None:
            raise ValueError(f"variable {variable['name']}: {text!r} is not label_values(selector, label)")
        found.append(
            Variable(
                variable["name"],
                match["selector"],
                match["label"],
                bool(variable.get("multi")),
                bool(variable.get("includeAll")),
                variable.get("allValue"),
            )
        )
    return found


def _regex_escape(value: str) -> str:
    return _REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(), value.replace("\\", "\\\\\\\\"))


def interpolate(variable: Variable, selected: Sequence[str] | str) -> str:
    """What Grafana's Prometheus data source puts in place of a variable's reference."""
    if selected == ALL:
        if variable.all_value is None:
            # Without a custom all value Grafana joins every value, which the caller must list.
            raise ValueError(f"variable {variable.name} has no allValue: pass its values")
        return variable.all_value
    values = [selected] if isinstance(selected, str) else list(selected)
    if not variable.multi and not variable.include_all:
        [value] = values
        return value.replace("\\", "\\\\").replace("'", "\\'")
    escaped = [_regex_escape(v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def duration(ms: int) -> str:
    """A duration as PromQL reads it."""
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def builtins(interval_ms: int, scrape_interval_ms: int, range_ms: int) -> dict[str, str]:
    """Grafana's interval variables for a panel with this $__interval, scrape interval and time range.

    $__rate_interval is max($__interval + scrape interval, 4 x scrape interval): at least four
    scrapes in every rate() window, whatever the panel's resolution.
    """
    rate_interval = max(interval_ms + scrape_interval_ms, 4 * scrape_interval_ms)
    return {
        "__interval": duration(interval_ms),
        "__interval_ms": str(interval_ms),
        "__rate_interval": duration(rate_interval),
        "__range": duration(range_ms // 1000 * 1000),
        "__range_s": str(range_ms // 1000),
        "__range_ms": str(range_ms),
    }


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """`expr` with each $name and ${name} replaced; a name not in `values` is an error."""

    def replace(match: re.Match[str]) -> str:
        name = match["plain"] or match["braced"]
        if name not in values:
            raise KeyError(f"{expr!r} refers to ${name}, which the dashboard does not define")
        return values[name]

    return _VARIABLE.sub(replace, expr)


def evaluate(
    scrapes: Sequence[Scrape], exprs: Sequence[str], start_ms: int, end_ms: int, step_ms: int
) -> list[Answer]:
    """Store the scrapes as Prometheus would and run each expression as a range query."""
    request = {
        "scrapes": [
            {"target": dict(s.target), "time_ms": s.time_ms, "content_type": s.content_type, "text": s.text}
            for s in sorted(scrapes, key=lambda s: s.time_ms)
        ],
        "queries": [{"expr": e, "start_ms": start_ms, "end_ms": end_ms, "step_ms": step_ms} for e in exprs],
    }
    result = subprocess.run(
        [str(ensure_promeval())], input=json.dumps(request), capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"promeval failed ({result.returncode}): {result.stderr}")
    return [
        Answer(
            a["expr"],
            a.get("parse_error", ""),
            a.get("error", ""),
            tuple(a["metrics"]),
            tuple(a["series"]),
        )
        for a in json.loads(result.stdout)["answers"]
    ]
