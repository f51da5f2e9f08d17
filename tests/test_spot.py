"""Spot-aware plans: the expected cost against a Monte-Carlo simulation of preemptions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpugeek_jupyter import plan
from gpugeek_jupyter.catalog import load_catalog
from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.sizing import spot


def simulate(work, rate, interval, checkpoint, restart, trials, rng) -> float:
    """Mean wall hours over ``trials`` runs: Poisson preemptions (exponential gaps) while a
    segment of work plus its checkpoint runs; a preemption loses the segment and costs a restart."""
    segments = [interval] * int(work // interval)
    if work - len(segments) * interval > 1e-12:
        segments.append(work - len(segments) * interval)
    total = np.zeros(trials)
    for length in segments:
        needed = length + checkpoint
        running = np.arange(trials)
        while running.size:
            gap = rng.exponential(1 / rate, running.size)
            done = gap >= needed
            total[running[done]] += needed
            total[running[~done]] += gap[~done] + restart
            running = running[~done]
    return float(total.mean())


def test_expected_hours_match_a_simulation_of_preemptions_within_2_percent():
    rng = np.random.default_rng(2026)
    errors = []
    for _ in range(200):
        rate = 10 ** rng.uniform(-3, -0.5)           # 1 per 1000 h … 1 per 3 h
        checkpoint = rng.uniform(10, 600) / 3600
        restart = rng.uniform(1, 30) / 60
        interval = float(spot.best_interval(rate, checkpoint)) * rng.uniform(0.3, 3)
        work = rng.uniform(1, 200)
        expected = float(spot.expected_hours(work, rate, interval, checkpoint, restart))
        simulated = simulate(work, rate, interval, checkpoint, restart, 4000, rng)
        errors.append(abs(simulated - expected) / simulated)
    print(f"200 cases: worst {max(errors):.3%}, median {np.median(errors):.3%}")
    assert max(errors) < 0.02


def test_the_recommended_interval_is_the_simulations_argmin_within_its_grid_step():
    rng = np.random.default_rng(7)
    for _ in range(6):
        rate = 10 ** rng.uniform(-2, -0.7)
        checkpoint = rng.uniform(60, 900) / 3600
        restart = rng.uniform(1, 20) / 60
        best = float(spot.best_interval(rate, checkpoint))
        step = 0.1 * best
        grid = best * np.arange(0.4, 2.01, 0.1)
        # the same random draws at every grid point, so the curve's shape is not noise
        simulated = [simulate(40 * best, rate, g, checkpoint, restart, 3000, np.random.default_rng(1))
                     for g in grid]
        argmin = grid[int(np.argmin(simulated))]
        assert abs(argmin - best) <= step + 1e-9, (rate, checkpoint, argmin, best)


def test_young_is_the_first_order_value_of_the_exact_optimum():
    rate, checkpoint = 1e-4, 30 / 3600          # small λC: the two agree closely
    assert float(spot.best_interval(rate, checkpoint)) == pytest.approx(
        float(spot.young_daly(rate, checkpoint)), rel=0.01)
    rate = 0.2                                   # large λC: the exact root is shorter
    assert float(spot.best_interval(rate, checkpoint)) < float(spot.young_daly(rate, checkpoint))


def test_no_preemptions_cost_only_the_checkpoints_and_an_unknown_rate_stays_unknown():
    hours = spot.expected_hours(10.0, np.array([0.0, np.nan]), 2.0, 0.1, 0.5)
    assert hours[0] == pytest.approx(10 + 5 * 0.1)
    assert math.isnan(hours[1])
    assert math.isinf(float(spot.best_interval(0.0, 0.1)))


def test_a_bucket_becomes_a_poisson_rate():
    # 15–20 % of instances interrupted in a month (730 h), midpoint 17.5 %
    per_hour = spot.rate_table({"aws/H100": -math.log(1 - 0.175) / 730})[("aws", "H100")].per_hour
    assert 1 - math.exp(-per_hour * 730) == pytest.approx(0.175)


def test_the_users_rates_win_and_a_family_row_beats_its_providers():
    table = spot.rate_table({"aws": 0.01, "aws/H100": 0.05})
    rates = spot.node_rates(np.array(["aws", "aws", "gcp"], dtype=object),
                            np.array(["H100", "A100", "A100"], dtype=object), table)
    assert rates[0] == 0.05 and rates[1] == 0.01


def test_a_spot_plan_ranks_by_expected_cost_and_prices_preemptions(gpugeek_home):
    _config(gpugeek_home,
        '[spot]\npreemptions_per_hour = {"aws" = 0.05, "gcp" = 0.0}\n')
    on_demand = plan(params="1.3B", batch=8, provider="aws,gcp").table.set_index("id")
    result = plan(params="1.3B", batch=8, pricing="spot", provider="aws,gcp",
                  checkpoint_seconds=120, restart_minutes=15)
    table = result.table
    assert result.best is not None and table["cost"].is_monotonic_increasing
    for provider, node_rate in (("aws", 0.05), ("gcp", 0.0)):
        row = table[table["provider"] == provider].iloc[0]
        rate = node_rate * row["nodes"]
        work = on_demand.loc[row["id"], "est_hours"]
        best = float(spot.best_interval(rate, 120 / 3600))
        hours = float(spot.expected_hours(work, rate, min(best, 1e9), 120 / 3600, 0.25))
        assert row["preemptions_per_hour"] == pytest.approx(rate)
        assert row["spot_hours"] == pytest.approx(hours) and row["est_hours"] == pytest.approx(hours)
        assert row["cost"] == pytest.approx(hours * row["price"])       # spot $/h × nodes
        assert (row["spot_hours"] > work + 120 / 3600 + 1e-9) == (node_rate > 0)
    assert any("expected values" in a for a in result.assumptions)


def test_a_given_interval_is_used_and_the_best_shown_beside_it(gpugeek_home):
    _config(gpugeek_home, '[spot]\npreemptions_per_hour = {"aws" = 0.05}\n')
    on_demand = plan(params="1.3B", batch=8, provider="aws", gpus=8)
    every_hour = plan(params="1.3B", batch=8, provider="aws", gpus=8, checkpoint_every=60,
                      checkpoint_seconds=120, restart_minutes=15)
    row = every_hour.table.iloc[0]
    assert row["ckpt_every_min"] == 60
    work = on_demand.table.set_index("id").loc[row["id"], "est_hours"]
    expected = float(spot.expected_hours(work, 0.05, 1.0, 120 / 3600, 0.25))
    assert row["spot_hours"] == pytest.approx(expected)
    assert row["est_hours"] == pytest.approx(work)          # on-demand hours are not changed


@pytest.mark.parametrize("kwargs, words", [
    ({"checkpoint_every": -5}, "--checkpoint-every"),
    ({"restart_minutes": "soon"}, "--restart-minutes"),
    ({"checkpoint_seconds": 0}, "--checkpoint-seconds"),
])
def test_bad_spot_options_are_one_line(kwargs, words):
    with pytest.raises(GpugeekError, match=words):
        plan(params="1B", **kwargs)


def test_a_bad_spot_table_in_config_is_one_line(gpugeek_home):
    _config(gpugeek_home, '[spot]\npreemptions_per_hour = {"aws" = "often"}\n')
    with pytest.raises(GpugeekError, match=r"spot\.preemptions_per_hour"):
        plan(params="1B")


def _config(home, text: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(text)


def test_a_gpus_own_row_does_not_cover_its_other_variants(gpugeek_home):
    """The A100 row is AWS's p4d (40 GB); p4de (A100-80GB) has no figure of its own: aws's default."""
    table = plan(params="350M", provider="aws", gpus=8).table.set_index("instance_type")
    rates = spot.bundled_rates()
    assert table.loc["p4d.24xlarge", "preemptions_per_hour"].max() == pytest.approx(rates[("aws", "A100")].per_hour)
    assert table.loc["p4de.24xlarge", "preemptions_per_hour"].max() == pytest.approx(rates[("aws", "*")].per_hour)


@pytest.mark.parametrize("toml, words", [
    ('{"aws/A100-80G" = 0.01}', "aws/A100-80G names no offer"),
    ('{"awz" = 0.01}', "awz names no offer"),
    ('{"aws" = inf}', r"spot\.preemptions_per_hour"),
])
def test_a_spot_rate_key_that_names_nothing_or_an_infinite_rate_is_one_line(gpugeek_home, toml, words):
    _config(gpugeek_home, f"[spot]\npreemptions_per_hour = {toml}\n")
    with pytest.raises(GpugeekError, match=words):
        plan(params="1B")


def test_hours_are_wall_time_and_spot_trains_fewer_tokens_in_them(gpugeek_home):
    _config(gpugeek_home, '[spot]\npreemptions_per_hour = {"aws" = 0.05}\n')
    kwargs = dict(params="1.3B", batch=8, provider="aws", gpus=8, hours=10, checkpoint_seconds=120,
                  restart_minutes=15)
    on_demand = plan(**kwargs).table.set_index("id")
    on_spot = plan(pricing="spot", **kwargs).table.set_index("id")
    row = on_spot.iloc[0]
    assert row["est_hours"] == 10 and row["spot_hours"] == 10
    rate = 0.05 * row["nodes"]
    best = float(spot.best_interval(rate, 120 / 3600))
    share = 10 / float(spot.expected_hours(10, rate, best, 120 / 3600, 0.25))
    assert row["est_tokens"] == pytest.approx(on_demand.loc[row.name, "est_tokens"] * share)
    assert row["cost"] == pytest.approx(10 * row["price"]) and share < 1


def test_an_offer_without_a_rate_keeps_its_bare_spot_cost_beside_on_demand(gpugeek_home):
    table = plan(params="350M", provider="runpod").table
    row = table[table["cost_spot"].notna()].iloc[0]
    assert math.isnan(row["preemptions_per_hour"]) and math.isnan(row["spot_hours"])
    spot_price = load_catalog().set_index("id").loc[row["id"], "spot_price"]
    assert row["cost_spot"] == pytest.approx(row["est_hours"] * spot_price * row["nodes"])
