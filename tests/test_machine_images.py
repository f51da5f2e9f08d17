"""A cloud node starts from a machine image: Ray's launcher has its own for some regions only. Where
it has none, the offers say so and ``up`` refuses at once, before anything is made or any call
reaches the cloud, naming the next offer that can start and how to name your own image
(``[cluster.images]`` in config.toml), which the node's config then carries."""

from __future__ import annotations

import botocore.client
import pytest

import gpugeek_jupyter as gg
from gpugeek_jupyter.backends import launcher
from gpugeek_jupyter.cluster import registry
from gpugeek_jupyter.raynodes import ec2_default_images

WITHOUT = "ap-southeast-3"      # an AWS region whose offers the catalog holds, with no image of Ray's


@pytest.fixture
def ec2_calls(monkeypatch):
    """Every call the AWS SDK makes, recorded (none should be)."""
    calls = []
    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call",
                        lambda self, operation, params: calls.append(operation))
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    return calls


def _offer_without_image() -> str:
    offers = gg.offers(provider="aws", region=WITHOUT, count=1)
    assert not offers.empty and WITHOUT not in ec2_default_images()
    return str(offers.iloc[0]["id"])


def test_offers_mark_the_regions_where_the_launcher_has_no_image_of_its_own(gpugeek_home):
    offers = gg.offers(provider="aws", count=1, top=500)
    known = ec2_default_images()
    for region, up_with in zip(offers["region"], offers["up_with"], strict=True):
        assert up_with == ("aws" if region in known else "aws, with your image"), (region, up_with)
    assert "[cluster.images] aws" in offers.attrs["image_note"], offers.attrs


def test_up_in_such_a_region_is_refused_before_anything_is_made_or_called(gpugeek_home, ec2_calls, capsys):
    offer = _offer_without_image()
    with pytest.raises(gg.GpugeekError) as refused:
        gg.up("far", offer=offer, workers=1, budget=5, yes=True)
    said = str(refused.value)
    assert "\n" not in said and said.startswith(f"offer {offer}: Ray's launcher has no machine image of its own in "
                                                f"{WITHOUT}"), said
    assert f'[cluster.images] aws = {{"{WITHOUT}" = "ami-…"}}' in said and "nothing was started" in said, said
    elsewhere = said.split("the next offer that can start: --offer ")[1].split()[0]
    assert elsewhere.split("/")[2] in ec2_default_images(), elsewhere
    assert ec2_calls == [], ec2_calls                    # the SDK was never asked anything
    assert registry.live("far") is None and not launcher.node_files("far").exists()


def test_your_image_for_the_region_lets_it_start_and_is_the_nodes(gpugeek_home, ec2_calls):
    offer = _offer_without_image()
    gpugeek_home.mkdir(parents=True, exist_ok=True)
    (gpugeek_home / "config.toml").write_text(f'[cluster.images]\naws = {{"{WITHOUT}" = "ami-0123456789abcdef0"}}\n')
    assert gg.offers(provider="aws", region=WITHOUT, count=1)["up_with"].eq("aws").all()
    config = gg.up("far", offer=offer, workers=1, dry_run=True).config
    images = {k: v["node_config"].get("ImageId") for k, v in config["available_node_types"].items()}
    assert set(images.values()) == {"ami-0123456789abcdef0"}, images
    assert ec2_calls == []


@pytest.mark.parametrize("text", ['[cluster]\nimages = "ami-1"\n', '[cluster.images]\naws = {"r" = 3}\n'])
def test_a_malformed_images_table_is_one_line(gpugeek_home, text):
    gpugeek_home.mkdir(parents=True, exist_ok=True)
    (gpugeek_home / "config.toml").write_text(text)
    with pytest.raises(gg.GpugeekError, match=r"cluster.images must map a cloud to its regions' machine images"):
        gg.offers(provider="aws", count=1)


def test_every_backend_answers_where_it_can_start(gpugeek_home):
    """``up`` asks each backend before anything starts: none may fail to answer (your own machines
    and the rehearsals need no image; each cloud says for itself)."""
    from gpugeek_jupyter.backends.interface import BACKENDS

    answers = {name: backend.cannot_start_in(WITHOUT) for name, backend in BACKENDS.items()}
    assert {name for name, why in answers.items() if why} == {"aws"}, answers
