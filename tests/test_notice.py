"""Preemption notices as each cloud documents them (``clouds/``). The metadata endpoints exist only on cloud
VMs, so their answers here are the documented examples, served by a real HTTP server on
loopback; the sim backend's notice is exercised end to end in ``test_cluster_live.py``."""

from __future__ import annotations

import http.server
import json
import threading
import time
from datetime import datetime, timezone

import pytest

from gpugeek_jupyter.clouds import base as clouds_base
from gpugeek_jupyter.clouds.aws import AWS
from gpugeek_jupyter.clouds.azure import AZURE
from gpugeek_jupyter.clouds.gcp import GCP
from gpugeek_jupyter.workers import notice


@pytest.fixture()
def metadata(monkeypatch):
    """A loopback metadata server: {path: (status, body)}; the readers' URLs are pointed at it."""
    answers: dict[str, tuple[int, str]] = {}
    seen: list[tuple[str, str, dict]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
            status, body = answers.get(self.path.split("?")[0], (404, "not found"))
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body.encode())

        do_GET = do_PUT = _answer

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    real = clouds_base.metadata

    def local(method, url, headers):
        for host in ("http://169.254.169.254", "http://metadata.google.internal"):
            url = url.replace(host, base)
        return real(method, url, headers)

    monkeypatch.setattr(clouds_base, "metadata", local)
    yield answers, seen
    server.shutdown()
    server.server_close()


def test_aws_no_notice_is_a_404_and_a_notice_is_its_time(metadata):
    answers, seen = metadata
    answers["/latest/api/token"] = (200, "TOKEN")
    assert AWS.read_notice() is None
    answers["/latest/meta-data/spot/instance-action"] = (200, json.dumps(
        {"action": "terminate", "time": "2026-11-23T08:22:00Z"}))
    assert AWS.read_notice() == datetime(2026, 11, 23, 8, 22, tzinfo=timezone.utc).timestamp()
    put, get = seen[-2:]
    assert put[0] == "PUT" and put[2]["x-aws-ec2-metadata-token-ttl-seconds"]
    assert get[2]["x-aws-ec2-metadata-token"] == "TOKEN"             # IMDSv2: the session token


def test_gcp_preempted_flag_gives_its_30_seconds(metadata):
    answers, seen = metadata
    path = "/computeMetadata/v1/instance/preempted"
    answers[path] = (200, "FALSE")
    assert GCP.read_notice() is None
    answers[path] = (200, "TRUE")
    assert abs(GCP.read_notice() - (time.time() + 30)) < 2
    assert seen[-1][2]["metadata-flavor"] == "Google"


def test_azure_preempt_event_is_its_not_before(metadata):
    answers, seen = metadata
    path = "/metadata/scheduledevents"
    answers[path] = (200, json.dumps({"DocumentIncarnation": 1, "Events": []}))
    assert AZURE.read_notice() is None
    answers[path] = (200, json.dumps({"DocumentIncarnation": 2, "Events": [
        {"EventId": "1", "EventType": "Freeze", "NotBefore": "Mon, 23 Nov 2026 08:00:00 GMT"},
        {"EventId": "2", "EventType": "Preempt", "NotBefore": "Mon, 23 Nov 2026 08:22:00 GMT"}]}))
    assert AZURE.read_notice() == datetime(2026, 11, 23, 8, 22, tzinfo=timezone.utc).timestamp()
    assert seen[-1][2]["metadata"] == "true"


def test_a_metadata_error_other_than_404_is_raised_for_the_watch_to_record(metadata):
    answers, _ = metadata
    answers["/latest/api/token"] = (500, "boom")
    with pytest.raises(Exception, match="500"):
        AWS.read_notice()


def test_the_ranks_agree_on_the_latest_deadline_and_a_lone_rank_decides_alone():
    import torch

    assert notice.agreed_deadline(None, torch.device("cpu")) is None
    assert notice.agreed_deadline(1234.5, torch.device("cpu")) == 1234.5
