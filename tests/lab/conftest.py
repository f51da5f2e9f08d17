"""The multi-host lab (``tests/netlab.py``) for one test session: made once, torn down at the end,
and nothing of it may be left — no namespace, no link, no process. Its hosts share nothing with
the laptop: each ``up`` there makes (or finds made) each host's runtime, from the wheel index the
laptop serves on the lab's bridge."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import cloudbox
import netlab
import pytest


@pytest.fixture(scope="session")
def lab():
    """Three hosts that share nothing with the laptop; h3 is bare (the OS's python3 only); an S3
    server on the bridge, bucket ``lab``, which every host is configured for."""
    with netlab.fixture(3, bare=("h3",), storage=True) as made:
        yield made


@pytest.fixture(scope="session")
def box():
    """EC2 in a box (``tests/cloudbox``): moto on a bridge of its own, a host behind each instance;
    taken down at the end with every host, route and namespace it made."""
    if reason := netlab.why_not():
        pytest.skip(reason)
    made = cloudbox.start()
    try:
        yield made
    finally:
        made.down()
        left = made.leftovers()
        assert not left, f"the box left {', '.join(left)}"
        assert made.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.fixture
def aws_account(box, gpugeek_home, monkeypatch):
    """This machine as a laptop with an AWS account in the box: the SDK pointed at it, the hosts'
    pip mirror in config.toml. The key pairs Ray's launcher saves in ~/.ssh for that account are
    removed afterwards (HOME stays: Ray's token lives under it, and a test's own HOME would make
    every later cluster of the session another token)."""
    for key, value in box.env().items():
        monkeypatch.setenv(key, value)
    _rays_iam(box)
    gpugeek_home.mkdir(parents=True, exist_ok=True)
    (gpugeek_home / "config.toml").write_text(f'[hosts]\npip_index_url = "{box.lab.index_url}"\n')
    ssh = Path("~/.ssh").expanduser()
    before = set(ssh.glob("ray-autoscaler*.pem"))
    yield box
    for made in set(ssh.glob("ray-autoscaler*.pem")) - before:
        made.unlink()


_iam_made: set[int] = set()       # the boxes whose account has Ray's IAM instance profile and role


def _rays_iam(box) -> None:
    """The IAM instance profile and role that Ray's bootstrap makes for the head on an account's
    first ``ray up``, made by that same code of Ray's, once per box — without its two 15 s sleeps
    for AWS's propagation, which the box's IAM does not have. Every ``ray up`` then finds them, as
    on an account Ray's launcher was used from before; the head still gets its credentials from
    that profile, through its IMDS."""
    if id(box) in _iam_made:
        return
    from ray.autoscaler._private.aws import config as rays

    config = {"provider": {"type": "aws", "region": "us-east-1"}, "head_node_type": "head",
              "available_node_types": {"head": {"node_config": {}}}, "head_node": {}}
    with mock.patch.object(rays, "time", SimpleNamespace(sleep=lambda seconds: None)):
        rays._configure_iam_role(config)
    assert config["head_node"]["IamInstanceProfile"]["Arn"], config
    _iam_made.add(id(box))
