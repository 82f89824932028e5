"""The Grafana dashboard's queries parse with Prometheus' parser and name only what the project exports.

No cluster: promeval (deploy/local/promqlbin, built on first use) parses each query as Grafana
would send it and runs it over no samples. tests/e2e/test_dashboard.py runs the same queries
over series scraped from the driver.
"""

from __future__ import annotations

import pytest
from localcluster import grafana

DASHBOARD = grafana.load()
VARIABLES = {v.name: v for v in grafana.variables(DASHBOARD)}
BUILTINS = grafana.builtins(15_000, 15_000, 6 * 3600_000)


def _sent(expr: str) -> str:
    values = {name: grafana.interpolate(v, grafana.ALL) for name, v in VARIABLES.items()}
    return grafana.substitute(expr, {**values, **BUILTINS})


def test_every_query_parses_and_names_only_exported_metrics() -> None:
    panels = grafana.panel_queries(DASHBOARD)
    answers = grafana.evaluate([], [_sent(p.expr) for p in panels], 0, 60_000, 15_000)
    problems = [
        f"{panel.title}: {a.parse_error or a.error or grafana.unknown_metrics(a)}"
        for panel, a in zip(panels, answers, strict=True)
        if a.parse_error or a.error or grafana.unknown_metrics(a)
    ]
    assert not problems, "\n".join(problems)
    named = {m for a in answers for m in a.metrics}
    assert "dra_gpu_claim_device_info" in named
    assert {m for m in named if m.startswith(grafana.DCGM_PREFIX)}, "the DCGM join panels"
    assert named >= grafana.USAGE_SERIES, "a panel for each usage series"


def test_a_query_naming_a_metric_nobody_exports_is_flagged() -> None:
    [typo, dcgm] = grafana.evaluate(
        [], ["rate(dra_gpu_claim_busy_second_total[5m])", "DCGM_FI_DEV_GPU_UTIL"], 0, 60_000, 15_000
    )
    assert grafana.unknown_metrics(typo) == ["dra_gpu_claim_busy_second_total"]
    assert grafana.unknown_metrics(dcgm) == []


def test_the_driver_exports_every_usage_series_issue_27_names() -> None:
    assert grafana.exported_names() >= grafana.USAGE_SERIES


def test_panels_have_unique_ids_a_description_and_the_datasource_variable() -> None:
    panels = DASHBOARD["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["description"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]


def test_variables_offer_all_as_a_regex_and_escape_values_as_grafana_does() -> None:
    node, namespace = VARIABLES["node"], VARIABLES["namespace"]
    assert (node.selector, node.label) == ("nvidia_dra_prepared_devices", "node")
    assert (namespace.selector, namespace.label) == ("dra_gpu_claim_device_info", "dra_claim_namespace")
    assert grafana.interpolate(node, grafana.ALL) == ".*"
    # RE2's metacharacters behind an escaped backslash, inside PromQL's double quotes.
    assert grafana.interpolate(node, ["gpu-node-1.example"]) == "gpu-node-1\\\\.example"
    assert grafana.interpolate(namespace, ["team-a", "team-b"]) == "(team-a|team-b)"


def test_substitution_refuses_a_variable_the_dashboard_does_not_define() -> None:
    assert grafana.substitute('x{a=~"${node}"}[$__rate_interval]', {"node": "n", **BUILTINS}) == (
        'x{a=~"n"}[60s]'
    )
    with pytest.raises(KeyError, match=r"\$pod"):
        grafana.substitute('x{pod=~"$pod"}', BUILTINS)


@pytest.mark.parametrize(
    ("interval_ms", "scrape_ms", "expected"),
    [
        pytest.param(15_000, 15_000, "60s", id="four-scrapes"),
        pytest.param(120_000, 15_000, "135s", id="interval-plus-one-scrape"),
        pytest.param(2_000, 2_000, "8s", id="short-scrapes"),
    ],
)
def test_rate_interval_follows_grafanas_rule(interval_ms: int, scrape_ms: int, expected: str) -> None:
    assert grafana.builtins(interval_ms, scrape_ms, 3600_000)["__rate_interval"] == expected
