"""A folder the product makes on a host carries its mark (``onhost/marks.py``), and only a marked
folder is ever removed: a host's ``/tmp`` is shared, and a name like ours proves nothing. The
Slurm lab holds a job's sweep to it on real nodes (``tests/slurm/test_slurm_cluster.py``)."""

from __future__ import annotations

import json
import os

from heads import onhost

from gpugeek_jupyter.onhost import marks


def test_a_folder_named_like_ours_but_unmarked_is_never_taken_nor_removed(tmp_path):
    users = tmp_path / "gg-data-2024"
    (users / "keep").mkdir(parents=True)
    refused = marks.mark_folder(str(users), "a-marker")
    assert refused["ok"] is False and "did not make it" in refused["error"] and "another name" in refused["error"]
    assert not (users / marks.MADE_MARK).exists()
    assert marks.remove_ours(str(users)) is False and (users / "keep").is_dir()


def test_a_marked_folder_is_removed_by_its_cluster_or_its_job_alone(tmp_path):
    ours = tmp_path / "gg-0ldc1a55-42"
    assert marks.mark_folder(str(ours), "the-marker", "42") is None
    assert marks.made_by(str(ours))["job"] == "42"
    assert "the-marker" not in (ours / marks.MADE_MARK).read_text()     # a digest: the marker stays secret
    assert marks.remove_ours(str(ours), "another-marker") is False
    assert marks.remove_ours(str(ours), job="43") is False
    assert marks.mark_folder(str(ours), "the-marker", "42") is None       # ours already: a restart takes it
    assert marks.remove_ours(str(ours), "the-marker", "42") is True and not ours.exists()


def test_a_link_or_a_mark_that_is_not_a_mark_proves_nothing(tmp_path):
    target = tmp_path / "elsewhere"
    assert marks.mark_folder(str(target), "m") is None
    link = tmp_path / "gg-link-1"
    link.symlink_to(target)
    assert marks.made_by(str(link)) is None and marks.remove_ours(str(link)) is False and target.is_dir()
    forged = tmp_path / "gg-forged-2"
    forged.mkdir()
    (forged / marks.MADE_MARK).write_text(json.dumps(["not", "a", "mark"]))
    assert marks.made_by(str(forged)) is None and marks.remove_ours(str(forged)) is False


def test_the_host_scripts_stop_removes_rays_folder_by_its_mark_as_sent_over_ssh(tmp_path):
    """``onhost.py stop MARKER GRACE DIR`` run as SSH runs it (the script's text on stdin, its
    marks first): the cluster's marked folder goes, a folder of that name unmarked stays."""
    marked, unmarked = tmp_path / "gg-tag-0", tmp_path / "gg-tag-1"
    assert marks.mark_folder(str(marked), "stop-marker") is None
    unmarked.mkdir()
    marker = f"stop-marker-not-running-{os.getpid()}"
    assert onhost("stop", marker, "0.1", str(unmarked))["ok"] and unmarked.is_dir()
    assert onhost("stop", marker, "0.1", str(marked))["ok"] and marked.is_dir()     # another cluster's mark
    assert onhost("stop", "stop-marker", "0.1", str(marked))["ok"] and not marked.exists()
