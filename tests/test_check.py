"""``check``: one line for each way to get machines, found without launching anything — and
without the network here: no credentials, a missing SDK, a host that does not answer."""

from __future__ import annotations

import pytest

from gpugeek_jupyter import ports
from gpugeek_jupyter.api import check
from gpugeek_jupyter.cli import main
from gpugeek_jupyter.clouds import base

NO_AWS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
          "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
          "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_ENDPOINT_URL")


@pytest.fixture
def no_credentials(tmp_path, monkeypatch):
    """No AWS credentials anywhere the SDK looks (and no metadata service asked)."""
    for name in NO_AWS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none" / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none" / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def _one_line_each(found) -> None:
    text = str(found)
    assert text.count("\n") == len(found.lines) - 1, text
    assert all("\n" not in str(r) and "Traceback" not in str(r) for r in found.lines), text


def test_no_aws_credentials_is_one_line_saying_what_to_do(no_credentials):
    found = check("aws")
    assert [r.way for r in found.lines] == ["aws"] and not found.ready
    line = str(found.lines[0])
    assert "NOT READY: no AWS credentials found" in line and "aws configure" in line, line
    _one_line_each(found)


def test_a_missing_sdk_is_one_line_naming_what_to_install(no_credentials, tmp_path, monkeypatch):
    monkeypatch.setattr(base, "importable", lambda module: False)
    aws = check("aws").lines[0]
    assert not aws.ready and aws.line == "the AWS SDK is not installed — pip install boto3", aws
    key = tmp_path / "adc.json"
    key.write_text("{}")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "p")
    gcp = check("gcp").lines[0]
    assert not gcp.ready and gcp.line.endswith("pip install google-api-python-client"), gcp


def test_every_line_is_one_line_and_here_is_always_ready(no_credentials, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    closed = ports.free_port()
    found = check(hosts=f"root@127.0.0.1:{closed}", login=f"root@127.0.0.1:{closed}")
    ways = [r.way for r in found.lines]
    assert {"local", "aws", "gcp", "azure", "kuberay", "ssh", "slurm", "onprem"} <= set(ways), ways
    assert "sim" not in ways and "attach" not in ways       # nothing of their own to look at
    _one_line_each(found)
    here = found.lines[ways.index("local")]
    assert here.ready and "CPUs" in here.line
    refused = found.lines[ways.index("slurm")]
    assert not refused.ready and f"127.0.0.1:{closed}" in refused.line and "SSH" in refused.line, refused


def test_the_cli_exits_0_when_ready_1_when_not_2_on_bad_input(no_credentials, capsys):
    assert main(["check", "local"]) == 0
    assert main(["check", "local", "aws"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("local    ready: this machine") and "no AWS credentials" in out[-1], out
    assert main(["check", "nowhere"]) == 2
    assert capsys.readouterr().err.startswith("gpugeek: check: no way to get machines called 'nowhere'")
    assert main(["check", "slurm", "--login", "bad host!"]) == 1
    assert "--login 'bad host!' is not a host — write the login node as [USER@]HOST[:PORT]" in capsys.readouterr().out
    assert main(["check", "slurm"]) == 1
    assert "--login USER@HOST" in capsys.readouterr().out


def test_the_magic_prints_the_same_lines(ipython, no_credentials, capsys):
    assert ipython.run_line_magic("gpugeek", "check local aws") is None
    out = capsys.readouterr().out
    assert "local    ready" in out and "aws      NOT READY: no AWS credentials found" in out, out


@pytest.fixture
def moto_account(no_credentials, monkeypatch):
    """An AWS account of moto's, in this process (no network): its STS and EC2 answer the dry runs."""
    moto = pytest.importorskip("moto")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with moto.mock_aws():
        yield


def test_aws_ready_names_the_identity_region_and_what_it_may_launch(moto_account):
    found = check("aws")
    line = str(found.lines[0])
    assert found.ready and line.startswith("aws      ready: account 123456789012 as arn:aws:"), line
    assert "in us-east-1" in line and "may launch (dry runs of ec2:DescribeInstances" in line, line
    assert "RunInstances, CreateTags" in line, line
    assert "GPU vCPU quotas" in line, line       # moto has none to read: "not readable", still ready


def test_a_refused_launch_names_the_permission(moto_account, monkeypatch):
    """EC2 answers UnauthorizedOperation to a dry run the identity may not make."""
    from botocore.client import BaseClient
    from botocore.exceptions import ClientError

    real = BaseClient._make_api_call

    def refusing(self, operation, params):
        if operation == "RunInstances":
            raise ClientError({"Error": {"Code": "UnauthorizedOperation", "Message": "no"}}, operation)
        return real(self, operation, params)

    monkeypatch.setattr(BaseClient, "_make_api_call", refusing)
    aws = check("aws").lines[0]
    assert not aws.ready and "may not ec2:RunInstances — give it those permissions" in aws.line, aws
    assert "account 123456789012" in aws.line, aws
