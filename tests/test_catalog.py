from __future__ import annotations

import csv
import math
import re

import pytest

from gpugeek_jupyter import GpugeekError, offers
from gpugeek_jupyter.catalog import family_of, load_catalog
from gpugeek_jupyter.catalog.offers import bundled_catalog_path
from gpugeek_jupyter.config import settings
from gpugeek_jupyter.errors import NoMatchingOffers


def test_bundled_catalog_is_normalised():
    with bundled_catalog_path().open() as f:
        raw_rows = sum(1 for _ in csv.DictReader(f))
    assert raw_rows == 3335
    catalog = load_catalog()
    # AWS p4de.24xlarge appears twice in five zones (with and without spot): merged into one id.
    assert len(catalog) == 3330
    assert catalog["id"].is_unique
    assert catalog["gpu_mem_gib"].notna().all(), "every offer's GPU memory is known"
    assert set(catalog["provider"]) == {"aws", "gcp", "azure", "lambda", "runpod", "nebius", "vast"}
    p4de = catalog[catalog["id"] == "aws/p4de.24xlarge/us-east-1/use1-az4"].iloc[0]
    assert not math.isnan(p4de["spot_price"]), "the merged row keeps the spot price"
    assert (bundled_catalog_path().parent / "README.md").exists(), "provenance note shipped"


@pytest.mark.parametrize("raw, family", [
    ("H100-SXM", "H100"), ("H100-MEGA", "H100"), ("A100-80GB-SXM", "A100"), ("T4g", "T4"),
    ("Radeon MI25", "MI25"), ("RTX6000-Ada", "RTX6000-Ada"), ("V100-32GB", "V100"),
])
def test_gpu_names_reduce_to_families(raw, family):
    assert family_of(raw) == family


def test_ids_are_provider_instance_region_zone():
    catalog = load_catalog()
    lam = catalog[catalog["provider"] == "lambda"].iloc[0]
    assert lam["id"] == f"lambda/{lam['instance_type']}/{lam['region']}"
    aws = catalog[(catalog["provider"] == "aws") & (catalog["zone"] != "")].iloc[0]
    assert aws["id"] == f"aws/{aws['instance_type']}/{aws['region']}/{aws['zone']}"
    # One GCP host VM carries several accelerators: the accelerator joins the instance part.
    t4 = catalog[(catalog["provider"] == "gcp") & (catalog["gpu"] == "T4")]
    assert t4["id"].str.contains(r"n1-standard-8\+\dxT4/", regex=True).all()


def test_8x_h100_only_cheapest_first():
    frame = offers(gpu="H100", count=8)
    assert len(frame) > 10
    assert set(frame["gpu"]) == {"H100"}
    assert set(frame["gpu_count"]) == {8}
    assert frame["price"].is_monotonic_increasing
    for column in ("id", "provider", "instance_type", "gpu", "gpu_count", "gpu_mem_gib",
                   "region", "price", "price_per_gpu_hour"):
        assert column in frame
    assert (frame["price_per_gpu_hour"] * 8 == frame["price"]).all()
    assert {"H100-SXM", "H100-MEGA"} & set(load_catalog().loc[
        load_catalog()["id"].isin(frame["id"]), "gpu_name"]), "provider spellings were folded in"


def test_spot_reranks_and_drops_offers_without_spot():
    on_demand = offers(gpu="H100", count=8)
    spot = offers(gpu="H100", count=8, pricing="spot")
    assert spot["price"].is_monotonic_increasing
    assert (spot["price"] == spot["spot_price"]).all()
    assert spot["spot_price"].notna().all()
    assert len(spot) < len(on_demand), "offers without a spot price are dropped"
    assert list(spot["id"][:5]) != list(on_demand["id"][:5])


def test_reserved_is_a_labelled_estimate(gpugeek_home):
    frame = offers(gpu="A100", count=8, pricing="reserved")
    assert (abs(frame["price"] - frame["on_demand_price"] * 0.6) < 1e-9).all()
    assert "estimate" in frame.attrs["note"]
    gpugeek_home.mkdir(parents=True, exist_ok=True)
    (gpugeek_home / "config.toml").write_text("[catalog]\nreserved_discount = 0.25\n")
    frame = offers(gpu="A100", count=8, pricing="reserved")
    assert (abs(frame["price"] - frame["on_demand_price"] * 0.75) < 1e-9).all()


def test_filters_combine():
    frame = offers(count="8+", min_gpu_mem=80, provider="aws,gcp", region="us-*", max_price=60)
    assert (frame["gpu_count"] >= 8).all()
    assert (frame["gpu_mem_gib"] >= 80).all()
    assert set(frame["provider"]) <= {"aws", "gcp"}
    assert frame["region"].str.startswith("us-").all()
    assert (frame["price"] <= 60).all()
    assert len(offers(gpu="L4", top=3)) == 3


def test_user_catalog_adds_offers(tmp_path):
    path = tmp_path / "market.csv"
    path.write_text(
        "provider,instance_type,gpu,gpu_count,gpu_mem_gib,vcpus,mem_gib,region,zone,"
        "price_hour,spot_price_hour\n"
        "mymarket,box-8xh100,H100,8,,96,1024,home-1,,9.99,4.50\n"
    )
    frame = offers(gpu="H100", count=8, catalog=str(path))
    assert frame.iloc[0]["id"] == "mymarket/box-8xh100/home-1"
    assert frame.iloc[0]["gpu_mem_gib"] == 80, "memory filled from the spec table"


def test_user_catalog_errors_name_file_and_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text(
        "provider,instance_type,gpu,gpu_count,region,price_hour\n"
        "x,a,H100,8,r,1.0\n"
        "x,b,H100,eight,r,1.0\n"
    )
    with pytest.raises(GpugeekError, match=rf"{path}:3: gpu_count 'eight' is not a whole number"):
        offers(catalog=str(path))
    missing = tmp_path / "missing-columns.csv"
    missing.write_text("provider,gpu\nx,H100\n")
    with pytest.raises(GpugeekError, match=r"missing-columns.csv:1: catalog is missing column"):
        offers(catalog=str(missing))
    with pytest.raises(GpugeekError, match="does not exist"):
        offers(catalog=str(tmp_path / "nope.csv"))


def test_unknown_gpu_suggests_near_names():
    with pytest.raises(GpugeekError, match=r"unknown GPU 'A1000' — did you mean A100.*A10"):
        offers(gpu="A1000")
    with pytest.raises(GpugeekError, match=r"unknown provider 'awz' — did you mean aws"):
        offers(provider="awz")


def test_nothing_matches_names_nearest_offers():
    with pytest.raises(NoMatchingOffers) as info:
        offers(gpu="H100", count=3)
    message = str(info.value)
    assert message.startswith("no offers match --gpu H100 --count 3")
    assert "×8" in message and "\n" not in message
    with pytest.raises(NoMatchingOffers, match="similar GPUs: H"):
        offers(gpu="B200", pricing="spot")
    with pytest.raises(NoMatchingOffers, match="cheapest without --max-price"):
        offers(gpu="H100", max_price=0.5)


def test_config_entry_adds_a_user_catalog(gpugeek_home, tmp_path):
    path = tmp_path / "negotiated.csv"
    path.write_text("provider,instance_type,gpu,gpu_count,region,price_hour\n"
                    "ourdeal,8xa100,A100-80GB,8,eu-1,4.00\n")
    gpugeek_home.mkdir(parents=True, exist_ok=True)
    (gpugeek_home / "config.toml").write_text(f'[catalog]\npaths = ["{path}"]\n')
    frame = offers(gpu="A100", count=8)
    assert frame.iloc[0]["id"] == "ourdeal/8xa100/eu-1"
    assert frame.iloc[0]["variant"] == "80GB" and frame.iloc[0]["gpu_mem_gib"] == 80
    (gpugeek_home / "config.toml").write_text("[catalog\n")
    with pytest.raises(GpugeekError, match=r"config\.toml: cannot read settings"):
        offers()


@pytest.mark.parametrize("line, said", [
    ("meter_interval_s = 0", "cluster.meter_interval_s must be between 0.1 and 600 seconds"),
    ("unreachable_after_min = -1", "cluster.unreachable_after_min must be between 0.1 and 1440 minutes"),
    ('unreachable_after_min = "ten"', "cluster.unreachable_after_min must be between 0.1 and 1440 minutes"),
])
def test_a_bad_cluster_setting_is_one_line_naming_it(gpugeek_home, line, said):
    gpugeek_home.mkdir(parents=True, exist_ok=True)
    (gpugeek_home / "config.toml").write_text(f"[cluster]\n{line}\n")
    with pytest.raises(GpugeekError, match=re.escape(said)):
        settings()
    (gpugeek_home / "config.toml").write_text("[cluster]\nunreachable_after_min = 2.5\n")
    assert settings().unreachable_after_s == 150.0


@pytest.mark.parametrize("name, variants", [
    ("H100-PCIe", {"PCIe"}), ("H100-NVL", {"NVL"}), ("A100-80GB", {"80GB"}), ("A100-40GB", {""}),
    ("H100", {"", "PCIe", "NVL"}),
])
def test_variant_spellings_pick_that_variant(name, variants):
    frame = offers(gpu=name)
    assert set(frame["variant"]) == variants


def test_non_utf8_catalog_is_one_line(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("provider,instance_type,gpu,gpu_count,region,price_hour\n"
                     "caf\xe9,a,H100,8,r,1.0\n".encode("latin-1"))
    with pytest.raises(GpugeekError, match="not UTF-8"):
        offers(catalog=str(path))


def test_every_offer_id_is_one_word_a_magic_line_can_carry():
    """Vast's regions read "Slovenia, SI, EU": an id made of them broke `--offer ID` in two."""
    import re
    import shlex

    ids = load_catalog()["id"]
    assert ids.is_unique
    bad = [i for i in ids if not re.fullmatch(r"[A-Za-z0-9._/+-]+", i)]
    assert bad == [], bad[:5]
    vast = ids[ids.str.startswith("vast/")]
    assert len(vast) == 61 and "vast/1x-H100_SXM-32-65536/Czechia-CZ-EU" in set(vast)
    assert all(shlex.split(f"--offer {i}") == ["--offer", i] for i in vast)
