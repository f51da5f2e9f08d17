"""A box rented on a marketplace (RunPod, Lambda, Vast…) and driven over SSH at an offer's price:
``down``, and the watchdog's budget and idle stops, end Ray on it — not the rental. Each says so in
one line: still rented, from whom, at what rate, and where to end it."""

from __future__ import annotations

import pytest

import gpugeek_jupyter as gg
from gpugeek_jupyter.backends.interface import BACKENDS, capable
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.guard import watchdog
from gpugeek_jupyter.provision.request import UpRequest, spec_of


def _rented(name: str, hosts: str, **asked):
    offers = gg.offers(provider="runpod", count=1)
    offer, price = str(offers.iloc[0]["id"]), float(offers.iloc[0]["price"])
    spec = spec_of(UpRequest.of(dict(name=name, backend="ssh", hosts=hosts, offer=offer, **asked)))
    record = registry.create(name, "ssh", spec.to_json(), simulated=False, budget_usd=None, idle_minutes=None)
    return record, offer, price


def test_a_rented_box_is_said_still_rented_with_its_rate_and_where_to_end_it(gpugeek_home):
    record, offer, price = _rented("box", "root@10.0.0.9,root@10.0.0.10")
    said = capable(record).still_billing(record)
    assert said == (f"the 2 boxes are still rented from runpod at ${2 * price:,.2f}/h (offer {offer}): this stopped "
                    f"Ray on them, not the rental — end it on runpod's site; the ledger counts none of it from here")
    assert watchdog._and_then(record) == f"; {said}"       # the budget and idle stops' events end with it


def test_your_own_machines_and_a_clouds_have_nothing_left_billing(gpugeek_home):
    spec = spec_of(UpRequest.of(dict(name="own", backend="ssh", hosts="root@10.0.0.9", usd_per_hour=1.0)))
    own = registry.create("own", "ssh", spec.to_json(), simulated=False, budget_usd=None, idle_minutes=None)
    assert capable(own).still_billing(own) is None       # no provider's offer: a machine of yours
    spec = spec_of(UpRequest.of(dict(name="cloud", backend="aws", gpu="T4", count=1)))
    cloud = registry.create("cloud", "aws", spec.to_json(), simulated=False, budget_usd=None, idle_minutes=None)
    assert capable(cloud).still_billing(cloud) is None   # its instances are ended through the cloud's API


def test_down_says_the_box_is_still_rented(gpugeek_home, monkeypatch, capsys):
    record, offer, price = _rented("box", "root@10.0.0.9")
    monkeypatch.setattr(BACKENDS["ssh"], "stop", lambda record, grace=5.0: None)   # no host here to stop Ray on
    gg.down("box")
    out = capsys.readouterr().out
    assert f"box: the box is still rented from runpod at ${price:,.2f}/h (offer {offer}): this stopped Ray on it, " \
           f"not the rental — end it on runpod's site" in out, out
    assert registry.get(record.id).stopped is not None


@pytest.mark.parametrize("page", ["machines/marketplace.md", "how-to/budgets.md"])
def test_the_marketplace_and_budget_pages_say_so_first(page):
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / page).read_text()
    first = text.split("\n\n")[1]         # the first paragraph past the title
    assert "still rented" in first and "end" in first, first
