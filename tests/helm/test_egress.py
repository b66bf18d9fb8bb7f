"""The chart's NetworkPolicy egress (networkPolicy.egress): off by default; on, the gateway pods reach
only DNS, the Kubernetes API server, Redis, each kubernetes pool's sandbox pods on that pool's port,
and what extraTo adds. (Every scenario is also validated strictly against the Kubernetes schemas.)"""

from __future__ import annotations

from tests.helm.harness import SCENARIOS, helm_python, render


def _policy(r) -> dict:  # noqa: ANN001
    return next(o for o in r.of_kind("NetworkPolicy") if o["metadata"]["name"] == r.fullname)


def test_egress_stays_open_unless_enabled(chart: helm_python.Chart) -> None:
    r = render(chart, {"networkPolicy": {"enabled": True}})
    assert _policy(r)["spec"]["policyTypes"] == ["Ingress"] and "egress" not in _policy(r)["spec"]


def test_production_egress_names_dns_the_api_server_redis_and_each_pools_sandboxes(chart: helm_python.Chart) -> None:
    r = render(chart, SCENARIOS["production"]())
    spec = _policy(r)["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    rules = spec["egress"]
    dns, api = rules[0], rules[1]
    assert dns["to"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kube-system"}
    assert {(p["port"], p["protocol"]) for p in dns["ports"]} == {(53, "UDP"), (53, "TCP")}
    assert [p["port"] for p in api["ports"]] == [443, 6443]
    assert api["to"] == [{"ipBlock": {"cidr": "10.96.0.1/32"}}, {"ipBlock": {"cidr": "172.20.0.0/28"}}]
    sandboxes = {rule["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]:
                 [p["port"] for p in rule["ports"]] for rule in rules[3:] if "namespaceSelector" in rule["to"][0]}
    assert sandboxes == {"sandboxes": [8888], "sandboxes-small": [8888]}


def test_kitchen_sink_egress_reaches_its_external_redis_and_extra_peers(chart: helm_python.Chart) -> None:
    r = render(chart, SCENARIOS["kitchen-sink"]())
    rules = _policy(r)["spec"]["egress"]
    assert {"ports": [{"port": 6379, "protocol": "TCP"}], "to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}]} in rules \
        or any(rule.get("to", [{}])[0].get("podSelector", {}).get("matchLabels", {}).get(
            "app.kubernetes.io/component") == "redis" for rule in rules)
    assert rules[-1] == {"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}], "ports": [{"port": 4317}]}
