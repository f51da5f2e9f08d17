"""``gpugeek check aws`` against EC2 in a box (``tests/cloudbox``): the identity STS names, EC2's dry
runs of what Ray's launcher does (moto answers DryRunOperation for each), a refusal the box gives
as EC2 would (UnauthorizedOperation), and no credentials at all. Launches nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

MOTO_ACCOUNT = "123456789012"     # moto's default account


def _check(box, tmp_path: Path, *, credentials: bool = True) -> subprocess.CompletedProcess:
    """The real command, in a process of its own, with the box's environment (and a HOME of its own:
    no ~/.aws of this machine's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(box.env(), HOME=str(tmp_path), GPUGEEK_HOME=str(tmp_path / "gg"), AWS_EC2_METADATA_DISABLED="true")
    if not credentials:
        env.pop("AWS_ACCESS_KEY_ID")
        env.pop("AWS_SECRET_ACCESS_KEY")
    script = Path(sys.executable).with_name("gpugeek")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "gpugeek_jupyter.cli"]
    return subprocess.run([*command, "check", "aws"], env=env, capture_output=True, text=True, timeout=120)


def test_check_aws_names_the_identity_a_refused_permission_and_missing_credentials(box, tmp_path):
    ready = _check(box, tmp_path)
    assert ready.returncode == 0, ready.stdout + ready.stderr
    line = ready.stdout.strip()
    assert "\n" not in line and line.startswith("aws      ready: "), line
    assert f"account {MOTO_ACCOUNT} as arn:aws:" in line and f"::{MOTO_ACCOUNT}:" in line, line
    assert f"in {box.regions[0]}" in line and "dry runs of ec2:" in line and "RunInstances" in line, line
    assert "GPU vCPU quotas" in line, line      # read, or "not readable": never the line's verdict

    box.fault("UnauthorizedOperation", action="RunInstances")
    try:
        refused = _check(box, tmp_path)
    finally:
        box.clear_faults()
    assert refused.returncode == 1, refused.stdout + refused.stderr
    line = refused.stdout.strip()
    assert "\n" not in line and line.startswith("aws      NOT READY: "), line
    assert "may not ec2:RunInstances —" in line and "CreateTags" not in line.split("—")[0], line

    bare = _check(box, tmp_path, credentials=False)
    assert bare.returncode == 1, bare.stdout + bare.stderr
    assert bare.stdout.strip().startswith("aws      NOT READY: no AWS credentials found"), bare.stdout
    assert "aws configure" in bare.stdout and not bare.stderr, bare.stderr
