"""The compatibility check before training: the lock read as uv writes it, every difference from
it named (distribution, Python, CUDA against the driver), and this venv matching its own lock."""

import json
from dataclasses import asdict

import pytest

from ml.compat import (
    ABSENT,
    LOCK,
    SKIP_VARIABLE,
    Difference,
    Installed,
    Lock,
    _torch_cuda,
    check,
    compare,
    cuda_difference,
    cuda_version,
    pins,
)

pytestmark = pytest.mark.unit

LOCK_TEXT = """\
aiohappyeyeballs==2.7.1 \\
    --hash=sha256:065665c041c42a5938ed220bdcd7230f22527fbec085e1853d2402c8a3615d9d \\
    --hash=sha256:9243213661e29250eb41368e5daa826fc017156c3b8a11440826b2e3ed376472
    # via aiohttp
Flask_Cors==6.0.0 \\
    --hash=sha256:8b2a6bd2a36ba2c4cd5e2b1a25c7f1f5a9c8b5b5c8e4a1b2c3d4e5f60718293a
    # via
    #   ml-lifecycle (pyproject.toml)
    #   mlflow
torch==2.13.0+cpu \\
    --hash=sha256:60fcdcb2f3876e21146cb4524ef06397d727ca9ad5f020818547e25075fe3cb7
    # via ml-lifecycle (pyproject.toml)
uvicorn[standard]==0.40.0 ; python_version >= "3.0" \\
    --hash=sha256:1111111111111111111111111111111111111111111111111111111111111111
tomli==2.2.1 ; python_version < "3.0" \\
    --hash=sha256:2222222222222222222222222222222222222222222222222222222222222222
    # via pytest
"""


def lock(**pinned: str) -> Lock:
    return Lock(pins=pinned, requires_python=">=3.11,<3.12", project="ml-lifecycle")


def test_a_lock_gives_each_pin_by_canonical_name_without_hashes_comments_or_foreign_markers():
    assert pins(LOCK_TEXT) == {
        "aiohappyeyeballs": "2.7.1",
        "flask-cors": "6.0.0",
        "torch": "2.13.0+cpu",
        "uvicorn": "0.40.0",
    }


def test_an_entry_that_is_not_an_exact_pin_is_refused_by_name():
    with pytest.raises(ValueError, match="'numpy>=2' is not pinned"):
        pins("numpy>=2 \\\n    --hash=sha256:00\n")


def test_a_missing_and_an_other_version_distribution_are_exactly_the_differences():
    installed = Installed(
        distributions={"numpy": "2.3.2", "torch": "2.13.0+cpu", "ml-lifecycle": "0.1.0"},
        python="3.11.14",
    )
    found = compare(lock(numpy="2.3.1", pandas="2.3.3", torch="2.13.0+cpu"), installed)
    assert found.differences == [
        Difference("numpy", "2.3.1", "2.3.2"),
        Difference("pandas", "2.3.3", ABSENT),
    ]
    assert found.num_checked == 3 and found.unlocked == []


def test_a_locked_local_label_is_met_by_another_build_of_the_same_version():
    # The GPU image installs PyPI's CUDA build of the locked torch==X+cpu on purpose.
    installed = Installed(distributions={"torch": "2.13.0", "numpy": "2.3.1.0"}, python="3.11.0")
    assert compare(lock(torch="2.13.0+cpu", numpy="2.3.1"), installed).differences == []


def test_distributions_the_lock_does_not_name_are_recorded_not_refused():
    installed = Installed(
        distributions={"numpy": "2.3.1", "pip": "23.2.1", "nvidia-nccl-cu13": "2.28.3"},
        python="3.11.14",
    )
    found = compare(lock(numpy="2.3.1"), installed)
    assert found.differences == [] and found.refusal() is None
    assert found.unlocked == ["nvidia-nccl-cu13 2.28.3", "pip 23.2.1"]


def test_a_python_outside_the_projects_range_is_a_difference():
    found = compare(lock(), Installed(distributions={}, python="3.12.1"))
    assert found.differences == [Difference("python", ">=3.11,<3.12", "3.12.1")]


def test_torch_built_for_a_newer_cuda_major_than_the_driver_is_a_difference():
    difference = cuda_difference("13.0", "12.8")
    assert str(difference) == "cuda locked 13.0 (torch's build), installed 12.8 (the driver's)"
    found = compare(lock(), Installed({}, "3.11.14", torch_cuda="13.0", driver_cuda="12.8"))
    assert [difference.name for difference in found.differences] == ["cuda"]
    assert (found.torch_cuda, found.driver_cuda) == ("13.0", "12.8")


def test_a_driver_of_the_same_cuda_major_or_newer_runs_the_build():
    # CUDA's minor-version compatibility: torch's wheels bring their own 12.x runtime.
    assert cuda_difference("12.8", "12.4") is None
    assert cuda_difference("12.8", "13.0") is None


def test_a_cpu_build_needs_no_driver_and_a_cuda_build_without_one_is_a_difference():
    assert cuda_difference(None, None) is None
    assert cuda_difference(None, "12.8") is None
    assert cuda_difference("13.0", None) == Difference("cuda", "13.0 (torch's build)", ABSENT)


def test_the_versions_compared_are_read_as_torch_and_the_driver_give_them():
    import torch

    assert _torch_cuda() == torch.version.cuda  # read without importing torch
    assert [cuda_version(n) for n in (12080, 13000, 11020)] == ["12.8", "13.0", "11.2"]


def test_the_refusal_lists_every_difference_on_one_line_unless_skipped():
    installed = Installed(distributions={"numpy": "2.3.2"}, python="3.11.14")
    found = compare(lock(numpy="2.3.1", pandas="2.3.3"), installed)
    refusal = found.refusal()
    assert refusal is not None and "\n" not in refusal
    assert "2 place(s): numpy locked 2.3.1, installed 2.3.2; pandas locked 2.3.3," in refusal
    assert SKIP_VARIABLE in refusal
    skipped = compare(lock(numpy="2.3.1", pandas="2.3.3"), installed, skipped=True)
    assert skipped.refusal() is None and len(skipped.differences) == 2


def test_the_result_is_what_the_manifest_records_as_json():
    found = compare(lock(numpy="2.3.1"), Installed(distributions={}, python="3.11.14"))
    assert json.loads(json.dumps(asdict(found)))["differences"] == [
        {"name": "numpy", "locked": "2.3.1", "installed": ABSENT}
    ]


def test_a_lock_is_read_with_the_projects_python_range_and_name(tmp_path):
    (tmp_path / LOCK).write_text(LOCK_TEXT)
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "ML_Lifecycle"\nrequires-python = ">=3.11,<3.12"\n'
    )
    read = Lock.read(tmp_path)
    assert (read.project, read.requires_python, len(read.pins)) == (
        "ml-lifecycle",
        ">=3.11,<3.12",
        4,
    )


def test_this_venv_matches_its_lock(monkeypatch):
    monkeypatch.delenv(SKIP_VARIABLE, raising=False)
    found = check()
    assert found.differences == [], found.refusal()
    assert found.num_checked > 100 and not found.skipped
