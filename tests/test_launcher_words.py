"""A failed run of Ray's cluster launcher says why in one line, in the words of whoever said it (Ray's
``abort``, the exception that ended the run, ssh, our own node), with what to do where that is
known and where the whole log is — not just "failed (exit 1) — see the log".

The real ``ray up`` of this environment fails here without a network: on a provider type Ray has
none of, on AWS with no credentials (every AWS variable cleared, ``/dev/null`` for the shared
files, the metadata service off, the endpoint a closed port on this machine), and on a region Ray
has no machine image for (its AWS calls answered by moto, in the CLI's own process)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import yaml

from gpugeek_jupyter.backends import launcher, launchlog
from gpugeek_jupyter.errors import GpugeekError, LaunchRefused

NO_IMAGE = ("Node type `head` has no ImageId in its node_config and no default AMI is available for the region "
            "`ap-southeast-3`. ImageId will need to be set manually in your cluster config.")
# as Ray's CLI writes it when its output is not a terminal: cli_logger.abort's record, then click's Error
NO_IMAGE_OUTPUT = (
    "2026-05-04 10:11:12,013\tINFO commands.py:342 -- \x1b[37mCluster\x1b[39m: \x1b[1mgg\x1b[22m\n"
    "2026-05-04 10:11:12,110\tVINFO config.py:853 -- Created new security group \x1b[1mray-autoscaler-gg\x1b[22m"
    "\x1b[26m\x1b[0m\x1b[2m [id=sg-6c8b5982eeca00f5c]\x1b[22m\x1b[0m\n"
    f"2026-05-04 10:11:12,111\tPANIC config.py:731 -- \x1b[31m{NO_IMAGE}\x1b[39m\n"
    f"Error: {NO_IMAGE}\n")
LOG = Path("/home/u/.gpugeek/launch/gg-aws.log")


def test_the_no_image_words_are_rays_own():
    """The words the AMI advice is keyed on are the ones in Ray's AWS bootstrap (``_check_ami``)."""
    source = (Path(importlib.util.find_spec("ray").submodule_search_locations[0])
              / "autoscaler/_private/aws/config.py").read_text()
    for words in ("has no ImageId in its node_config", "and no default AMI is available for the region `{region}`. ",
                  "ImageId will need to be set manually in your cluster config."):
        assert words in source, words


def test_no_image_for_the_region_says_rays_words_and_how_to_name_an_image():
    said = launchlog.failure("`ray up -y`", NO_IMAGE_OUTPUT, LOG, 1)
    assert said == (f"`ray up -y` failed: {NO_IMAGE} — name your machine image in config.toml, [cluster.images] aws = "
                    '{"ap-southeast-3" = "ami-…"} (an Ubuntu with NVIDIA\'s driver), or pick an offer in another '
                    f"region (Ray's log: {LOG})"), said


def test_rays_abort_beats_clicks_error_line_with_its_placeholders_unfilled():
    """``abort("Unknown provider type {}\\n…", name, …)``: the record has the words, click's line the ``{}``."""
    text = ("2026-05-04 10:11:12,672\tPANIC commands.py:308 -- "
            "\x1b[31mUnknown provider type \x1b[1mnosuchcloud\x1b[22m\n"
            "Available providers are: \x1b[1mlocal\x1b[22m\x1b[0m, \x1b[0m\x1b[1maws\x1b[22m\x1b[39m\n"
            "Error: Unknown provider type {}\n"
            "Available providers are: {}\n")
    assert launchlog.reason(text) == "Unknown provider type nosuchcloud; Available providers are: local, aws"


def test_rays_error_records_in_a_row_are_the_reason_where_it_aborts_without_words():
    text = ("2026-05-04 10:11:12,824\tERR commands.py:279 -- \x1b[31mCluster config invalid\x1b[39m\n"
            "2026-05-04 10:11:12,824\tERR commands.py:281 -- \x1b[31mFailed to load YAML file \x1b[1mgg.yaml\x1b[22m"
            "\x1b[39m\n"
            "2026-05-04 10:11:12,824\tERR commands.py:283 -- \x1b[31m\x1b[1m!!! \x1b[22mPyYAML error:\x1b[39m\n"
            "2026-05-04 10:11:12,824\tERR commands.py:284 -- \x1b[31mwhile parsing a flow sequence\n"
            '  in "<unicode string>", line 2, column 11:\n'
            "    provider: [oops\n"
            "              ^\n"
            "expected ',' or ']', but got '<stream end>'\n"
            '  in "<unicode string>", line 3, column 1:\n'
            "    \n"
            "    ^\x1b[39m\n"
            "2026-05-04 10:11:12,824\tERR commands.py:283 -- \x1b[31m\x1b[1m!!!\x1b[22m\x1b[39m\n"
            "Error: Exiting due to cli_logger.abort()\n")
    assert launchlog.reason(text) == ("Cluster config invalid: Failed to load YAML file gg.yaml: while parsing a flow "
                                      "sequence; expected ',' or ']', but got '<stream end>'")


def test_the_exception_that_ended_the_run_is_the_reason_not_an_error_logged_before_it():
    text = ("2026-05-04 10:11:12,030\tINFO commands.py:422 -- Checking AWS environment settings\n"
            "2026-05-04 10:11:12,180\tERROR commands.py:430 -- Failed to autodetect node resources.\n"
            "Traceback (most recent call last):\n"
            '  File "/x/ray/autoscaler/_private/commands.py", line 427, in _bootstrap_config\n'
            "    config = provider_cls.fillout_available_node_types_resources(config)\n"
            "             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
            "KeyError: 'InstanceType'\n"
            "\n"
            "Traceback (most recent call last):\n"
            '  File "/x/ray/autoscaler/_private/aws/config.py", line 401, in _configure_key_pair\n'
            "    key_name = config['auth']['ssh_private_key']\n"
            "KeyError: 'ssh_private_key'\n"
            "\n"
            "During handling of the above exception, another exception occurred:\n"
            "\n"
            "Traceback (most recent call last):\n"
            '  File "/x/ray/scripts/scripts.py", line 1711, in up\n'
            "    create_or_update_cluster(\n"
            "ValueError: Missing field ssh_private_key in auth: give it or a KeyName\n")
    said = launchlog.failure("`ray up -y`", text, LOG, 1)
    assert said == ("`ray up -y` failed: ValueError: Missing field ssh_private_key in auth: give it or a KeyName — "
                    f"the whole log is at {LOG}"), said


def test_a_nodes_own_answer_beats_rays_banners():
    """A setup command of ours that failed on the head: its words, not "Failed to setup head node."."""
    text = ('{"ok": false, "error": "installing ray==2.60.0 from https://pypi.org/simple failed: no route to host"}\n'
            "2026-05-04 10:11:12,500\tERR updater.py:185 -- \x1b[31mNew status: \x1b[1mupdate-failed\x1b[22m\x1b[39m\n"
            "2026-05-04 10:11:12,500\tERR updater.py:187 -- \x1b[31m!!!\x1b[39m\n"
            "2026-05-04 10:11:12,501\tERR updater.py:201 -- \x1b[31mFull traceback: Traceback (most recent call "
            "last):\n"
            '  File "/x/ray/autoscaler/_private/updater.py", line 502, in do_update\n'
            '    raise click.ClickException("Setup command failed.")\n'
            "click.exceptions.ClickException: Setup command failed.\n"
            "\x1b[39m\n"
            "2026-05-04 10:11:12,501\tERR updater.py:203 -- \x1b[31mError message: Setup command failed.\x1b[39m\n"
            "2026-05-04 10:11:12,501\tERR updater.py:204 -- \x1b[31m!!!\x1b[39m\n"
            "2026-05-04 10:11:12,502\tPANIC commands.py:925 -- \x1b[31mFailed to setup head node.\x1b[39m\n"
            "Error: Failed to setup head node.\n")
    assert launchlog.reason(text) == ("installing ray==2.60.0 from https://pypi.org/simple failed: no route to host")
    banners_only = text.split("\n", 1)[1]
    assert launchlog.reason(banners_only) == "Failed to setup head node.", "a banner, where nothing says more"


def test_ssh_refusing_the_key_is_the_reason_and_says_which_flag_gives_one():
    text = ("ubuntu@203.0.113.7: Permission denied (publickey).\n"
            "Error: Command failed:\n\n  ssh -tt -i ~/.ssh/ray-autoscaler_us-east-1.pem ubuntu@203.0.113.7 bash\n")
    said = launchlog.failure("`ray exec /x/gg-aws.yaml`", text, LOG, 1)
    assert said.startswith("`ray exec /x/gg-aws.yaml` failed: ubuntu@203.0.113.7: Permission denied (publickey). — "
                           "the machine did not take the SSH key"), said
    assert "--ssh-key" in said and said.endswith(f"(Ray's log: {LOG})"), said


def test_an_ssh_try_before_ssh_answered_is_not_the_reason():
    text = ("ssh: connect to host 203.0.113.7 port 22: Connection refused\n"
            "2026-05-04 10:11:12,300\tSUCC updater.py:301 -- \x1b[32mSuccess.\x1b[39m\n"
            "2026-05-04 10:11:13,000\tPANIC commands.py:925 -- \x1b[31mFailed to setup head node.\x1b[39m\n")
    assert launchlog.reason(text) == "Failed to setup head node."


def test_kubectls_error_line_is_a_reason():
    text = "error: You must be logged in to the server (Unauthorized)\n"
    assert launchlog.reason(text) == "error: You must be logged in to the server (Unauthorized)"


def test_the_reason_is_one_bounded_line():
    text = "Traceback (most recent call last):\n  File \"x\", line 1\nRuntimeError: " + "very long " * 500 + "\n"
    said = launchlog.reason(text)
    assert said is not None and "\n" not in said and len(said) <= launchlog.LIMIT and said.endswith("…"), said
    assert said.startswith("RuntimeError: very long very long")


def test_output_that_says_nothing_readable_keeps_the_exit_status_and_the_log():
    text = "2026-05-04 10:11:12,013\tINFO commands.py:342 -- Cluster: gg\nsome output\n\x1b[0m\n"
    assert launchlog.reason(text) is None
    assert launchlog.failure("`ray up -y`", text, LOG, 3) == f"`ray up -y` failed (exit 3) — see {LOG}"


def _fails(tmp_path, code: str) -> str:
    log = tmp_path / "launch" / "c-aws.log"
    with pytest.raises(GpugeekError) as failed:
        launcher._run([sys.executable, "-c", code], ["up", "-y"], log)
    return str(failed.value)


def test_run_says_the_reason_of_a_failed_command(tmp_path):
    said = _fails(tmp_path, "raise ValueError('no default for the head node type')")
    assert said == ("`ray up -y` failed: ValueError: no default for the head node type — the whole log is at "
                    f"{tmp_path / 'launch' / 'c-aws.log'}"), said


def test_run_keeps_a_clouds_refusal_and_the_ssh_wait_as_they_were(tmp_path):
    refused = ("import sys; sys.stderr.write('An error occurred (VcpuLimitExceeded) when calling the RunInstances "
               "operation: You have requested more vCPU capacity than your current vCPU limit of 0 allows.\\n'); "
               "sys.exit(1)")
    with pytest.raises(LaunchRefused) as caught:
        launcher._run([sys.executable, "-c", refused], ["up", "-y"], tmp_path / "r.log")
    assert caught.value.code == "VcpuLimitExceeded" and str(caught.value).startswith("`ray up -y` failed (exit 1)")
    silent = f"import sys; print('{launcher.SILENT}'); sys.exit(1)"
    assert _fails(tmp_path, silent).startswith("`ray up` gave up: a new machine answered no SSH")


# -- the real `ray up` of this environment, failing offline ------------------------------------------

@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No AWS credentials anywhere, nothing that reaches past this machine: the metadata service
    off, the endpoint a closed port here; Ray's home and temp files in ``tmp_path``."""
    for key in list(os.environ):
        if key.startswith(("AWS_", "GOOGLE_", "AZURE_")):
            monkeypatch.delenv(key)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_METADATA_SERVICE_TIMEOUT", "1")
    monkeypatch.setenv("AWS_METADATA_SERVICE_NUM_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    return tmp_path


def _aws_config(path: Path, region: str, **head) -> Path:
    path.write_text(yaml.safe_dump({
        "cluster_name": "gg", "max_workers": 0, "provider": {"type": "aws", "region": region},
        "auth": {"ssh_user": "ubuntu"}, "head_node_type": "head",
        "available_node_types": {"head": {"node_config": {"InstanceType": "m5.large", **head},
                                          "resources": {"CPU": 2}}}}))
    return path


def _one_line_naming(said: str, log: Path) -> None:
    assert "\n" not in said and "Traceback" not in said and "\x1b" not in said, said
    assert str(log) in said and "failed (exit" not in said, said


@pytest.mark.slow
def test_real_ray_up_without_aws_credentials_says_so_and_what_to_run(offline, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")     # were a request made: here, refused
    config, log = _aws_config(offline / "gg-aws.yaml", "us-east-1"), offline / "launch" / "gg-aws.log"
    with pytest.raises(GpugeekError) as failed:
        launcher.ray_cli("up", "-y", str(config), log=log, timeout=120)
    said = str(failed.value)
    assert not isinstance(failed.value, LaunchRefused)
    _one_line_naming(said, log)
    assert said == ("`ray up -y` failed: botocore.exceptions.NoCredentialsError: Unable to locate credentials — run "
                    f"`aws configure` (or set AWS_PROFILE), then `gpugeek check aws` (Ray's log: {log})"), said
    assert "Could not connect to the endpoint URL" not in log.read_text()


@pytest.mark.slow
def test_real_ray_up_on_a_provider_it_has_not_says_rays_words(offline):
    config, log = offline / "gg.yaml", offline / "launch" / "gg.log"
    config.write_text(yaml.safe_dump({"cluster_name": "gg", "provider": {"type": "nosuchcloud"},
                                      "auth": {"ssh_user": "ubuntu"}}))
    with pytest.raises(GpugeekError) as failed:
        launcher.ray_cli("up", "-y", str(config), log=log, timeout=120)
    said = str(failed.value)
    _one_line_naming(said, log)
    assert said.startswith("`ray up -y` failed: Unknown provider type nosuchcloud; "
                           "Available providers are: local, "), said
    assert said.endswith(f" — the whole log is at {log}") and "{}" not in said, said


# Ray's CLI with moto answering its AWS calls in the same process: nothing leaves it
MOCKED_RAY = "from moto import mock_aws; mock_aws().start(); from ray.scripts.scripts import main; main()"


@pytest.mark.slow
def test_real_ray_up_in_a_region_without_rays_image_says_how_to_name_one(offline, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    # the head's instance profile given: Ray's bootstrap makes no IAM role (and waits no 15 s for one)
    config = _aws_config(offline / "gg-aws.yaml", "ap-southeast-3",
                         IamInstanceProfile={"Arn": "arn:aws:iam::123456789012:instance-profile/gg-head"})
    log = offline / "launch" / "gg-aws.log"
    with pytest.raises(GpugeekError) as failed:
        launcher._run([sys.executable, "-c", MOCKED_RAY, "up", "-y", str(config)], ["up", "-y"], log, timeout=180)
    said = str(failed.value)
    _one_line_naming(said, log)
    assert said == (f"`ray up -y` failed: {NO_IMAGE} — name your machine image in "
                    'config.toml, [cluster.images] aws = {"ap-southeast-3" = "ami-…"} (an Ubuntu with NVIDIA\'s '
                    f"driver), or pick an offer in another region (Ray's log: {log})"), said
    assert "PANIC" in log.read_text(), "Ray's own abort, as the captured text above has it"
