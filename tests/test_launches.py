"""What a cloud head's autoscaler could not launch (``guard/launches.py``), read from its log in Ray's
own words (the lines below are as Ray 2.60's autoscaler v2 wrote them on a head in the EC2 box, and
as v1's node launcher words them), and the spot fallback it leads to. ``tests/lab/test_aws_spot.py``
holds the same on a cluster in the box."""

from __future__ import annotations

import yaml

from gpugeek_jupyter.clouds.aws import AWS
from gpugeek_jupyter.clouds.base import Instance
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.cluster.spec import ClusterSpec
from gpugeek_jupyter.guard.launches import FELL_BACK, NEWS, REFUSED, Launches, copy_news, news
from gpugeek_jupyter.meter import ledger
from gpugeek_jupyter.provision.nodetypes import build_spec, offer_row

V2 = ("2026-12-06 03:21:26,151\tINFO node_provider.py:491 -- Failed to launch 1 nodes of type t4x1-spot: Node Launch "
      "Exception (SpotMaxPriceTooLow): Your Spot request price is lower than the minimum required Spot request "
      "fulfillment price.\n")
V1 = ("2026-12-06 03:21:31,000\tERROR node_launcher.py:140 -- Failed to launch 1 node(s) of type t4x1-spot. "
      "(InsufficientInstanceCapacity): We currently do not have sufficient g4dn.xlarge capacity in the Availability "
      "Zone you requested (us-east-1a).\n")
OTHER = "2026-12-06 03:21:30,952\tINFO scheduler.py:1557 -- Adding 1 nodes to satisfy min count for node type.\n"


def _cluster(spot_fallback: bool):
    row = offer_row("aws/g4dn.xlarge/us-east-1/use1-az1")
    spec = build_spec("aws", row, pricing="spot", workers=2, max_workers=2, spot_fallback=spot_fallback)
    record = registry.create("c1", "aws", spec.to_json(), simulated=False, budget_usd=None, idle_minutes=None)
    return record, ClusterSpec.from_json(record.spec)


def _config(path, spec) -> None:
    types = {"head": {"min_workers": 0, "max_workers": 0, "node_config": {}, "resources": {}}}
    types.update({t.name: {"min_workers": t.min_workers, "max_workers": t.max_workers, "node_config": {},
                           "resources": {"GPU": 1}} for t in spec.node_types})
    path.write_text(yaml.safe_dump({"cluster_name": "c1", "available_node_types": types}))


def _spot(iid: str, gone: bool = False) -> Instance:
    return Instance(iid, "t4x1-spot", 1.0, None, "terminated" if gone else "running", "", True, gone)


def test_a_refusal_is_said_once_in_the_clouds_words_and_the_workers_fall_back_to_on_demand(gpugeek_home, tmp_path):
    record, spec = _cluster(spot_fallback=True)
    log, config = tmp_path / "monitor.log", tmp_path / "ray_bootstrap_config.yaml"
    _config(config, spec)
    launches = Launches(log, config)
    launches.look(record.id, spec, AWS, lambda: [])            # no log yet: nothing
    assert not ledger.events(record.id)
    log.write_text(OTHER + V2 + V2 + "2026-12-06 03:21:36 INFO … Failed to launch 1 nodes of type t4")  # a part line
    launches.look(record.id, spec, AWS, lambda: [_spot("i-1"), _spot("i-2", gone=True)])
    [refused] = ledger.events(record.id, REFUSED)
    assert refused["message"] == (
        "aws refused the head's autoscaler a t4x1-spot worker: SpotMaxPriceTooLow (Your Spot request price is lower "
        "than the minimum required Spot request fulfillment price.) — " + AWS.refusals["SpotMaxPriceTooLow"])
    [fell] = ledger.events(record.id, FELL_BACK)
    assert fell["message"].startswith("aws has no spot g4dn.xlarge for the workers (SpotMaxPriceTooLow): 1 on-demand "
                                      "worker (t4x1-on-demand, $0.526/h each) launch in their place, beside the 1 "
                                      "spot ones that run")
    types = yaml.safe_load(config.read_text())["available_node_types"]
    assert (types["t4x1-spot"]["min_workers"], types["t4x1-spot"]["max_workers"]) == (1, 1)   # the one that runs stays
    assert types["t4x1-on-demand"]["min_workers"] == 1
    with open(log, "a") as f:              # the rest of that line, then v1's wording of another refusal
        f.write("x1-spot: Node Launch Exception (SpotMaxPriceTooLow): again.\n" + V1)
    launches.look(record.id, spec, AWS, lambda: [])
    said = [e["message"] for e in ledger.events(record.id, REFUSED)]
    assert len(said) == 2 and "InsufficientInstanceCapacity (We currently do not have sufficient g4dn.xlarge" in said[1]
    assert len(ledger.events(record.id, FELL_BACK)) == 1, "the fallback is made once"


def test_without_spot_fallback_a_refusal_is_said_and_the_config_left_alone(gpugeek_home, tmp_path):
    record, spec = _cluster(spot_fallback=False)
    log, config = tmp_path / "monitor.log", tmp_path / "ray_bootstrap_config.yaml"
    _config(config, spec)
    before = config.read_text()
    log.write_text(V1)
    Launches(log, config).look(record.id, spec, AWS, lambda: [])
    assert [e["kind"] for e in ledger.events(record.id)] == [REFUSED]
    assert config.read_text() == before


def test_the_heads_news_reaches_the_notebooks_ledger_once_and_is_printed_once(gpugeek_home, tmp_path):
    """The head puts its latest news in its heartbeat; the notebook's watchdog copies each event
    once, with the head's time, and a notebook prints it once (``ledger.NEWS``)."""
    record, spec = _cluster(spot_fallback=True)
    ledger.event(record.id, REFUSED, "refused", at=100.0)
    ledger.event(record.id, "up", "up", at=101.0)
    ledger.event(record.id, FELL_BACK, "fell back", at=102.0)
    told = news(record.id)
    assert [e["kind"] for e in told] == [REFUSED, FELL_BACK]
    here = registry.create("c2", "aws", spec.to_json(), simulated=False, budget_usd=None, idle_minutes=None)
    assert copy_news(here.id, told) == 2 and copy_news(here.id, told) == 0
    assert [(e["kind"], e["at"]) for e in ledger.events(here.id)] == [(REFUSED, 100.0), (FELL_BACK, 102.0)]
    assert set(NEWS) <= set(ledger.NEWS)
    assert [e["message"] for e in ledger.take_unshown_events(here.id)] == ["refused", "fell back"]
    assert ledger.take_unshown_events(here.id) == []
