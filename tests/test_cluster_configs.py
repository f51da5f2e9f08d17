"""Cloud launcher YAML and KubeRay manifests from offers, and bad input — no cluster started."""

from __future__ import annotations

import copy
import csv
import json
import shlex
import stat
from importlib import metadata, resources
from pathlib import Path

import pytest
import yaml

import gpugeek_jupyter as gg
from gpugeek_jupyter import ports, raynodes
from gpugeek_jupyter.backends import hosts, launcher
from gpugeek_jupyter.clouds import CLOUDS
from gpugeek_jupyter.clouds import base as clouds_base
from gpugeek_jupyter.errors import GpugeekError
from gpugeek_jupyter.onhost import script as onhost
from gpugeek_jupyter.remote import runtime, ssh


@pytest.mark.parametrize("backend, gpu, count, pricing", [
    ("aws", "A100", 8, "spot"),
    ("gcp", "T4", 1, "spot"),          # an n1 host with an attached GPU
    ("gcp", "H100", 8, "on-demand"),
    ("azure", "A100", 8, "on-demand"),
])
def test_launcher_yaml_passes_rays_validation(backend, gpu, count, pricing):
    shown = gg.up(backend=backend, gpu=gpu, count=count, workers=2, max_workers=4, pricing=pricing)
    assert isinstance(shown, gg.LaunchConfig), "without --yes a cloud is shown, not launched"
    config = yaml.safe_load(shown.path.read_text())
    assert config == shown.config
    launcher.validate(config)                     # Ray's own defaults + JSON schema
    worker = next(v for k, v in config["available_node_types"].items() if k != "head")
    offer = gg.offers(gpu=gpu, count=count, provider=backend, pricing=pricing).iloc[0]
    assert worker["min_workers"] == 2 and worker["max_workers"] == 4
    assert worker["resources"]["GPU"] == count
    node = worker["node_config"]
    instance = {"aws": node.get("InstanceType"), "gcp": node.get("machineType"),
                "azure": node.get("azure_arm_parameters", {}).get("vmSize")}[backend]
    assert instance == offer["instance_type"]
    if pricing == "spot":
        assert {"aws": node.get("InstanceMarketOptions", {}).get("MarketType"),
                "gcp": node.get("scheduling", {}).get("provisioningModel")}[backend] in ("spot", "SPOT")
    if backend == "gcp" and gpu == "T4":
        assert node["guestAccelerators"] == [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}]
    head = shown.config["available_node_types"]["head"]["node_config"]
    if backend == "aws":       # the catalog's own m5.xlarge row of the workers' region, on demand
        text = (resources.files("gpugeek_jupyter.catalog") / "data" / "aws-head-nodes.csv").read_text()
        rows = [r for r in csv.DictReader(text.splitlines())
                if r["InstanceType"] == head["InstanceType"] and r["Region"] == offer["region"]]
        assert rows and f"priced at ${float(rows[0]['Price']):g}/h" in shown.next_step, shown.next_step
    else:
        assert "not priced" in shown.next_step, "the unpriced CPU head is said, not hidden"
    assert not gg.clusters()["name"].tolist(), "showing a config records no cluster"


@pytest.mark.parametrize("backend, gpu", [("aws", "A100"), ("gcp", "H100"), ("azure", "A100")])
def test_launcher_yaml_starts_ray_as_the_ssh_backend_does(backend, gpu):
    """The start commands run ``onhost.py start`` (shipped by file_mounts with the token), on the
    ssh backend's ports; Ray validates them and sees `ray start` with an autoscaling config."""
    shown = gg.up(backend=backend, gpu=gpu, count=8, workers=2)
    prepared = launcher.validate(shown.config)
    node_dir = launcher.node_dir(backend)
    assert prepared["file_mounts"] == {node_dir: str(launcher.node_files(backend))}
    [head], [worker] = prepared["head_start_ray_commands"], prepared["worker_start_ray_commands"]
    python = runtime.python_on_host()       # the runtime the setup command makes on every node
    assert f"{python} {node_dir}/onhost.py start " in head and f"{python} {node_dir}/onhost.py start " in worker
    [setup] = prepared["setup_commands"]
    assert setup.startswith(f"python3 {node_dir}/runtime.py install ")
    wanted = json.loads(shlex.split(setup)[-1])
    assert (wanted["ray"], wanted["torch"], wanted["install"]) == (metadata.version("ray"), metadata.version("torch"),
                                                                  True)
    assert "ray start" in head and "--autoscaling-config=~/ray_bootstrap_config.yaml" in head  # else Ray warns
    head_order, worker_order = _order(head), _order(worker)
    for order in (head_order, worker_order):
        assert (order["port"], order["keeper_port"]) == (hosts.GCS_PORT, hosts.KEEPER_PORT)
        assert order["token_path"] == f"{node_dir}/auth_token" and order["marker"] == launcher.SHOWN_MARKER
        assert "{ip}" in order["temp_dir"], "nodes sharing a /tmp (the lab) need temp dirs of their own"
    assert head_order["role"] == "head" and head_order["gpus"] == 0
    assert worker_order["role"] == "worker" and "head" not in worker_order   # RAY_HEAD_IP, as Ray exports
    assert "the folder in its file_mounts is written then" in shown.next_step

    folder = launcher.write_node_files(backend)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE((folder / "auth_token").stat().st_mode) == 0o600
    assert (folder / "onhost.py").read_text() == ssh.host_script()
    assert Path(onhost.__file__).read_text() in ssh.host_script()
    assert (folder / "runtime.py").read_text() == Path(runtime.SCRIPT).read_text()


def test_aws_workers_that_checkpoint_to_s3_get_the_heads_profile_and_the_file_system(monkeypatch):
    """With ``--storage s3://…`` on AWS, the workers are launched with the instance profile Ray's
    launcher makes for the head (whose role may use S3: Ray gives none to workers), every node's
    runtime gets s3fs, and Ray's wait for a machine's SSH is the one config.toml sets; a cloud that
    grants storage access otherwise, or no storage, leaves the workers' config as it was."""
    shown = gg.up(backend="aws", gpu="T4", count=1, workers=2, pricing="spot", storage="s3://bucket/run")
    prepared = launcher.validate(shown.config)
    worker = next(v for k, v in prepared["available_node_types"].items() if k != "head")
    assert worker["node_config"]["IamInstanceProfile"] == {"Name": "ray-autoscaler-v1"}
    assert worker["node_config"]["InstanceMarketOptions"] == {"MarketType": "spot"}
    [setup] = prepared["setup_commands"]
    assert any(p.startswith("s3fs") for p in json.loads(shlex.split(setup)[-1])["extra"]), setup
    head = _order(prepared["head_start_ray_commands"][0])
    assert head["env"]["AUTOSCALER_NODE_START_WAIT_S"] == "240"
    plain = gg.up(backend="aws", gpu="T4", count=1, workers=2)
    worker = next(v for k, v in plain.config["available_node_types"].items() if k != "head")
    assert "IamInstanceProfile" not in worker["node_config"]
    gcp = gg.up(backend="gcp", gpu="T4", count=1, workers=1, storage="gs://bucket/run")
    worker = next(v for k, v in gcp.config["available_node_types"].items() if k != "head")
    assert "IamInstanceProfile" not in worker["node_config"]


def test_onprem_yaml_is_the_clouds_with_the_hosts_for_its_provider():
    """Your own machines through Ray's launcher: the same generator, the same setup and start
    commands; only what names the machines differs (Ray's on-premise provider, which refuses node
    types of its own: Ray's validation fills in its one)."""
    hosts = "root@10.213.1.11,root@10.213.1.12,root@10.213.1.13"
    cloud = gg.up("same", backend="aws", gpu="A100", count=8, workers=2).config
    own = gg.up("same", backend="onprem", hosts=hosts, ssh_key="/k", gpus_per_host=8, usd_per_hour=2.0,
                dry_run=True).config
    machines = {"cluster_name", "max_workers", "provider", "auth", "available_node_types", "head_node_type"}
    starts = {"head_start_ray_commands", "worker_start_ray_commands"}
    setup = {"setup_commands"}
    assert {k: v for k, v in cloud.items() if k not in machines | starts | setup} == \
        {k: v for k, v in own.items() if k not in machines | starts | setup}
    [cloud_setup], [own_setup] = cloud["setup_commands"], own["setup_commands"]
    cloud_order, own_order = (json.loads(shlex.split(c)[-1]) for c in (cloud_setup, own_setup))
    # the same runtime, and the cloud's SDK for the head's autoscaler, which launches the workers
    assert cloud_order == {**own_order, "extra": sorted({*own_order["extra"], "boto3"})}
    resources = {"gpus", "cpus", "node_type", "dashboard"}    # a cloud's head is a CPU machine
    for key in starts:
        [a], [b] = cloud[key], own[key]
        assert a.split(" start ")[0] == b.split(" start ")[0] and shlex.split(a)[7:] == shlex.split(b)[7:]
        assert {k: v for k, v in _order(a).items() if k not in resources} == \
            {k: v for k, v in _order(b).items() if k not in resources}
    assert own["provider"] == {"type": "local", "head_ip": "10.213.1.11", "worker_ips": ["10.213.1.12", "10.213.1.13"]}
    assert own["auth"] == {"ssh_user": "root", "ssh_private_key": "/k"} and own["max_workers"] == 2
    prepared = launcher.validate(own)             # Ray's prepare_local + its JSON schema
    [node_type] = prepared["available_node_types"].values()
    assert (node_type["min_workers"], node_type["max_workers"]) == (2, 2), "every host kept in the cluster"
    head = _order(own["head_start_ray_commands"][0])
    assert head["gpus"] == 8 and "node_type" not in head, "the head trains too, its node type Ray's own"
    given = gg.up("same", backend="onprem", hosts=hosts, ssh_key="/k", usd_per_hour=0, python="/opt/py/bin/python",
                  dry_run=True).config       # --python: Ray runs in your environment, which setup checks
    assert all(c.startswith("ulimit -n 65536; /opt/py/bin/python ")
               for c in given["head_start_ray_commands"] + given["worker_start_ray_commands"])
    assert json.loads(shlex.split(given["setup_commands"][0])[-1])["python"] == "/opt/py/bin/python"
    assert not gg.clusters()["name"].tolist(), "showing a config records no cluster"


def _order(command: str) -> dict:
    words = shlex.split(command)
    return json.loads(words[words.index("start") + 1])


class _Started:
    def __init__(self, cmd, env, **_):
        _Started.cmd, _Started.env = cmd, env

    def wait(self, timeout=None):
        return 0


def test_onhost_start_from_the_launchers_order(tmp_path, monkeypatch):
    """What the YAML's commands make of ``onhost.py start`` on a node (``ray start`` itself faked):
    the marker and token auth in Ray's environment, the token file 0600 though it arrived 0644,
    the autoscaler and no Ray Client server on the head, the head's address and node type from
    Ray's exports on a worker."""
    monkeypatch.setenv("HOME", str(tmp_path))
    config = gg.up(backend="aws", gpu="A100", count=8).config
    token = tmp_path / launcher.node_dir("aws").removeprefix("~/") / "auth_token"
    token.parent.mkdir(parents=True)
    token.write_text("secret\n")
    token.chmod(0o644)
    monkeypatch.setattr(onhost.subprocess, "Popen", _Started)
    monkeypatch.setattr(onhost, "node_ip", lambda peer=None: "10.0.0.5" if peer is None else "10.0.0.6")
    for key in ("RAY_HEAD_IP", "RAY_NODE_TYPE_NAME"):
        monkeypatch.delenv(key, raising=False)

    words = shlex.split(config["head_start_ray_commands"][0].split("; ", 1)[1])
    assert onhost.start(words[words.index("start") + 1:])["ok"]
    cmd, env = _Started.cmd, _Started.env
    assert {"--head", "--port=6379", "--node-ip-address=10.0.0.5",
            "--num-gpus=0", "--autoscaling-config=~/ray_bootstrap_config.yaml"} <= set(cmd)
    assert not [word for word in cmd if "client-server" in word] and onhost.HEAD_START in cmd
    temp_dir = _order(config["head_start_ray_commands"][0])["temp_dir"].replace("{ip}", "10.0.0.5")
    assert "--no-monitor" not in cmd and f"--temp-dir={temp_dir}" in cmd
    assert f"--system-config={json.dumps(raynodes.LINK_CONFIG)}" in cmd    # the cluster's gRPC keepalive
    assert env[onhost.MARKER] == launcher.SHOWN_MARKER and env["RAY_AUTH_MODE"] == "token"
    assert env["RAY_AUTH_TOKEN_PATH"] == str(token) and env["RAY_NODE_TYPE_NAME"] == "head"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and token.read_text() == "secret\n"
    assert stat.S_IMODE(token.parent.stat().st_mode) == 0o700

    monkeypatch.setenv("RAY_HEAD_IP", "10.0.0.5")
    monkeypatch.setenv("RAY_NODE_TYPE_NAME", "a100x8-on-demand")
    words = shlex.split(config["worker_start_ray_commands"][0].split("; ", 1)[1])
    assert onhost.start(words[words.index("start") + 1:])["ok"]
    cmd, env = _Started.cmd, _Started.env
    assert "--address=10.0.0.5:6379" in cmd and "--node-ip-address=10.0.0.6" in cmd
    assert not any(c.startswith(("--num-gpus", "--head", "--autoscaling", "--system-config")) for c in cmd)
    assert env["RAY_NODE_TYPE_NAME"] == "a100x8-on-demand"

    token.unlink()
    assert "no token" in onhost.start(words[words.index("start") + 1:])["error"]
    monkeypatch.delenv("RAY_HEAD_IP")
    assert "RAY_HEAD_IP is not set" in onhost.start(words[words.index("start") + 1:])["error"]


def test_head_is_found_with_rays_cli(tmp_path, monkeypatch):
    """``ray get-head-ip`` and ``ray exec … node-ip`` as Ray prints them (its own lines first, a
    tty's carriage returns); a head without an address is one line."""
    said = {"get-head-ip": "Loaded cached provider configuration\nFetched IP: 54.1.2.3\n54.1.2.3\n",
            "exec": 'Fetched IP: 54.1.2.3\r\nbash: no job control in this shell\r\n{"ip": "172.31.5.6"}\r\n'}
    calls = []

    def ray_cli(*args, log, timeout=None):
        calls.append(args)
        return said[args[0]]

    monkeypatch.setattr(launcher, "ray_cli", ray_cli)
    monkeypatch.setattr(launcher, "ssh_login", lambda path, log: ("ubuntu", "~/.ssh/ray-autoscaler_us-east-1.pem"))
    path, log = tmp_path / "c.yaml", tmp_path / "log"
    head = launcher.find_head("c1", path, log)
    assert head == launcher.Head("54.1.2.3", "172.31.5.6", "ubuntu", "~/.ssh/ray-autoscaler_us-east-1.pem")
    assert calls[1] == ("exec", str(path), launcher.node_ip_command("c1"))
    said["get-head-ip"] = "Head node of cluster (c1) not found!\n"
    with pytest.raises(GpugeekError, match="Ray's launcher gave no head address"):
        launcher.find_head("c1", path, log)


def test_ssh_login_is_read_from_the_config_ray_up_bootstrapped(tmp_path, monkeypatch):
    """`ray up` caches the bootstrapped config (auth with the key it made) under the config's hash
    in the temp dir; the login is read from there. No cloud SDK is installed here, so a miss
    could not reach a cloud — it would fail."""
    import hashlib

    from ray.autoscaler._private.util import prepare_config

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    shown = gg.up(backend="aws", gpu="A100", count=8)
    prepared = prepare_config(copy.deepcopy(yaml.safe_load(shown.path.read_text())))
    digest = hashlib.sha256(json.dumps([prepared], sort_keys=True).encode()).hexdigest()
    bootstrapped = {**prepared, "auth": {"ssh_user": "ubuntu", "ssh_private_key": "~/.ssh/ray-autoscaler_x.pem"}}
    (tmp_path / f"ray-config-{digest}").write_text(json.dumps({"_version": 1, "config": bootstrapped}))
    assert launcher.ssh_login(shown.path, tmp_path / "log") == ("ubuntu", "~/.ssh/ray-autoscaler_x.pem")


def test_broken_launcher_config_is_rejected_by_ray():
    shown = gg.up(backend="aws", gpu="A100", count=8)
    broken = copy.deepcopy(shown.config)
    broken["max_workers"] = "x"
    with pytest.raises(GpugeekError, match="Ray rejects the generated aws config: 'x' is not of type 'integer'"):
        launcher.validate(broken)


def test_spot_fallback_adds_an_on_demand_node_type():
    shown = gg.up(backend="aws", gpu="H100", count=8, pricing="spot", spot_fallback=True, workers=2)
    types = shown.config["available_node_types"]
    assert set(types) == {"head", "h100x8-spot", "h100x8-on-demand"}
    assert types["h100x8-spot"]["node_config"]["InstanceMarketOptions"] == {"MarketType": "spot"}
    assert "InstanceMarketOptions" not in types["h100x8-on-demand"]["node_config"]
    assert types["h100x8-on-demand"]["min_workers"] == 0


def test_kuberay_manifest_has_gpu_limits_per_group():
    shown = gg.up(backend="kuberay", gpu="A100", count=8, workers=2, max_workers=3, pricing="spot",
                  spot_fallback=True)
    manifest = yaml.safe_load(shown.path.read_text())
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayCluster"
    assert manifest["spec"]["enableInTreeAutoscaling"] is True
    groups = {g["groupName"]: g for g in manifest["spec"]["workerGroupSpecs"]}
    assert set(groups) == {"a100x8-spot", "a100x8-on-demand"}
    spot = groups["a100x8-spot"]
    assert (spot["minReplicas"], spot["replicas"], spot["maxReplicas"]) == (2, 2, 3)
    container = spot["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "8"
    offer = gg.offers(gpu="A100", count=8, pricing="spot").iloc[0]
    assert spot["template"]["spec"]["nodeSelector"]["node.kubernetes.io/instance-type"] == offer["instance_type"]
    head = manifest["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in head["resources"]["limits"]


def test_dry_run_of_sim_shows_fake_multinode_config():
    shown = gg.up(backend="sim", gpu="A100", count=8, workers=2, dry_run=True)
    types = shown.config["available_node_types"]
    assert types["a100x8-on-demand"]["resources"]["GPU"] == 8
    assert types["a100x8-on-demand"]["resources"]["accelerator_type:A100"] == 1
    assert shown.config["provider"]["type"] == "fake_multinode"
    assert "CPUs scaled to fit this machine" in shown.next_step


def _one_line(ipython, capsys, line):
    result = ipython.run_cell(f"%gpugeek {line}")
    out = capsys.readouterr()
    text = (out.out + out.err).strip()
    assert result.error_in_exec is not None or "UsageError" in text
    lines = text.splitlines()
    assert len(lines) == 1, lines
    assert "Traceback" not in text
    return lines[0]


@pytest.mark.parametrize("line, expected", [
    ("up --backend moon", "unknown backend 'moon' — use one of local, sim, ssh, aws, azure, gcp, onprem, kuberay"),
    ("up --backend sim --offer aws/p5.48xlarge/us-east-9",
     "no offer with id 'aws/p5.48xlarge/us-east-9' — did you mean"),
    ("up --backend sim --gpu A100 --count 8 --workers 0", "--workers 0 must be a whole number ≥ 1"),
    ("up --backend sim --gpu A100 --count 8 --budget -5", "--budget -5.0 must be a number > 0"),
    ("up --backend sim --gpu A100 --count 8 --budget lots", "--budget 'lots' is not a number"),
    ("up --backend sim --gpu A100 --count 8 --idle 0", "--idle 0.0 must be a number > 0"),
    ("up --backend aws --offer gcp/a2-highgpu-8g/asia-northeast1/asia-northeast1-a",
     "is a gcp offer — the aws backend needs a aws offer"),
    ("up --backend local --gpu A100", "--gpu: the local backend runs on this machine"),
    ("up --backend sim --gpu A100 --count 8 --pricing spot --spot-fallback --max-workers 1 --workers 2",
     "--max-workers 1 is below the 2 worker nodes asked for"),
    ("up --backend sim --gpu A100 --spot-fallback", "--spot-fallback only makes sense with --pricing spot"),
    ("up --backend sim", "nothing says what to run on — give --offer ID, --plan VAR or --gpu NAME"),
    ("up --backend sim --plan nothing_here", "no variable 'nothing_here'"),
    ("up bad/name", "cluster name 'bad/name'"),
    ("up --backend ssh --usd-per-hour 1", "--hosts names no machine — name them"),
    ("up --backend ssh --hosts a@@b --usd-per-hour 1", "--hosts 'a@@b' is not a host — write each host as "
                                                       "[USER@]HOST[:PORT]"),
    ("up --backend ssh --hosts h1,h1 --usd-per-hour 1", "--hosts: a host is named twice"),
    ("up --backend ssh --hosts h1,h2", "what each host costs is not said — give --usd-per-hour X"),
    ("up --backend ssh --hosts h1 --usd-per-hour -1", "--usd-per-hour -1.0 is not a price — give a number of dollars"),
    ("up --backend ssh --hosts h1 --usd-per-hour 1 --max-workers 2", "--max-workers: an ssh cluster is the --hosts"),
    ("up --backend sim --gpu A100 --hosts h1", "--hosts: only for --backend ssh"),
    ("up --backend ssh --hosts 127.0.0.1:1 --usd-per-hour 0", "127.0.0.1:1: SSH failed"),
    ("status nosuch", "no cluster named 'nosuch'"),
    ("down nosuch", "no cluster named 'nosuch'"),
    ("cost nosuch", "no cluster named 'nosuch'"),
    ("preempt abc nosuch", "no cluster named 'nosuch'"),
    ("scale 0 nosuch", "workers 0 must be a whole number ≥ 1"),
    ("up --backend local --env nothing.txt", "--env nothing.txt: no such file"),
    ("up --address nohost", "--address 'nohost' is not an address — give host:port"),
    ("up --address 127.0.0.1:1", "nothing answers at 127.0.0.1:1"),
    ("up --backend kuberay --gpu A100 --count 8 --budget 5 --yes", "not enforced on KubeRay yet"),
    ("up --backend sim --gpu A100 --count 8 --budget inf", "--budget 'inf' must be a finite number"),
])
def test_bad_input_is_one_line(ipython, capsys, line, expected):
    assert expected in _one_line(ipython, capsys, line)


def test_launch_without_credentials_is_one_line(ipython, capsys, tmp_path, monkeypatch):
    for var in (v for provider in CLOUDS.values() for v in provider.credentials[0]):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))           # no ~/.aws, ~/.config/gcloud, ~/.azure
    monkeypatch.setenv("PATH", "/nonexistent")          # no kubectl
    expected = {"aws": "no AWS credentials found", "gcp": "no Google Cloud credentials found",
                "azure": "no Azure credentials found"}
    for backend, message in expected.items():
        assert message in _one_line(ipython, capsys, f"up --backend {backend} --gpu A100 --count 8 --yes")
    assert "kubectl is not on PATH" in _one_line(ipython, capsys, "up --backend kuberay --gpu A100 --count 8 --yes")
    # credentials present but the SDK `ray up` needs is not: also one line, naming the package
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\n")
    monkeypatch.setattr(clouds_base, "importable", lambda module: False)
    assert "needs the aws SDK — pip install boto3" in _one_line(
        ipython, capsys, "up --backend aws --gpu A100 --count 8 --yes")
    assert gg.clusters().empty, "a launch refused up front records nothing"


def test_an_ssh_head_takes_other_ports_when_the_usual_ones_are_held(tmp_path, monkeypatch):
    """A host already running a Ray (another cluster of ours, or the user's own) holds 6379, and
    another keeper the keeper's port: the head goes on free ports and says which, so the workers,
    the watchdog's keeper and the tunnel follow it."""
    import socket

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(onhost.subprocess, "Popen", _Started)
    monkeypatch.setattr(onhost, "TOKEN", "secret")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        order = {"role": "head", "marker": "m", "temp_dir": str(tmp_path / "ray"), "ip": "127.0.0.1", "gpus": 0,
                 "token_path": str(tmp_path / "token"), "port": taken, "keeper_port": taken, "free_ports": True}
        # the system may hand the port it just let go to the next ask: never one for both
        first, second = ports.free_ports(2)
        handed = iter([first, first, second])
        monkeypatch.setattr(onhost, "_any_free_port", lambda ip: next(handed))
        answer = onhost.start([json.dumps(order)])
    assert answer["ok"] and taken not in (answer["port"], answer["keeper_port"])
    assert (answer["port"], answer["keeper_port"]) == (first, second)
    assert f"--port={answer['port']}" in _Started.cmd


def test_a_local_heads_ports_are_chosen_together_so_never_one_twice():
    """Ray refuses a head whose GCS and client server share a port; ports chosen one at a time can
    (the system hands back the one just let go): ``free_ports`` holds each until all are bound."""
    chosen = ports.free_ports(64)
    assert len(set(chosen)) == 64 and all(ports.is_free(port) for port in chosen)


def test_a_ray_client_whose_server_failed_to_start_tries_again(monkeypatch):
    """The head's proxy sometimes fails to start a client's server (under load): a new attempt
    gets a new one; any other refusal is not retried."""
    import ray

    from gpugeek_jupyter.kernel import connection

    calls = []

    def init(address, **kwargs):
        calls.append(address)
        if len(calls) == 1:
            raise ConnectionAbortedError("Initialization failure from server:\nStarting Ray client server failed")
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(connection.time, "sleep", lambda s: None)
    connection._client_init("ray://127.0.0.1:1", {})
    assert calls == ["ray://127.0.0.1:1"] * 2

    def refuse(address, **kwargs):
        calls.append(address)
        raise ConnectionAbortedError("Initialization failure from server:\nversion mismatch")
    calls.clear()
    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(ConnectionAbortedError):
        connection._client_init("ray://127.0.0.1:1", {})
    assert len(calls) == 1
