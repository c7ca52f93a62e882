import json

import pytest

pytestmark = pytest.mark.unit


def test_the_workers_error_file_is_whole_or_absent(tmp_path, monkeypatch):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from ml.train import WholeErrorFile

    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    handler = WholeErrorFile()

    def interrupted(data, sink):
        sink.write('{"message": ')
        raise KeyboardInterrupt  # the agent's SIGTERM, mid-write

    monkeypatch.setattr(json, "dump", interrupted)
    try:
        raise RuntimeError("peer rank 1 is gone")
    except RuntimeError as error:
        with pytest.raises(KeyboardInterrupt):
            handler.record_exception(error)
    assert not path.exists()  # torch's own handler leaves '{"message": ' here
    assert [p.name for p in tmp_path.iterdir()] == []

    monkeypatch.undo()
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    try:
        raise RuntimeError("peer rank 1 is gone")
    except RuntimeError as error:
        handler.record_exception(error)
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(path))
    assert failure.error_file_data["message"]["message"] == "RuntimeError: peer rank 1 is gone"
