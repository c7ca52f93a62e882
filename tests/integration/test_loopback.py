"""A local training job listens on the loopback only: its rendezvous, rank 0's store and gloo's
pairs, as launched by LocalTorchrun and the layout probe (`ml.node.local_command`)."""

import ipaddress
import os
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from ml.node import local_command

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

WORKER = """
import os, sys, time
from pathlib import Path

import torch
import torch.distributed as dist

from ml.train import process_group

folder = Path(sys.argv[1])
with process_group(timeout_s=60) as ranks:
    total = torch.ones(1)
    dist.all_reduce(total)  # the store and every gloo pair are up
    assert total.item() == ranks.world_size
    (folder / f"up-{ranks.rank}").write_text(str(os.getpid()))
    while not (folder / "stop").exists():
        time.sleep(0.05)
    dist.barrier()
"""


def listening(root: psutil.Process) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket of `root` and its descendants."""
    found = []
    for process in [root, *root.children(recursive=True)]:
        try:
            connections = process.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        found += [
            (process.pid, c.laddr.ip, c.laddr.port)
            for c in connections
            if c.status == psutil.CONN_LISTEN
        ]
    return found


def outward_interface() -> dict[str, str]:
    """GLOO_SOCKET_IFNAME naming an interface with an address beyond the loopback, if this
    machine has one: where gloo would listen if the job did not choose the loopback itself (as
    it would on a machine whose hostname resolves to such an address)."""
    for name, addresses in psutil.net_if_addrs().items():
        for address in addresses:
            if (
                address.family == socket.AF_INET
                and not ipaddress.ip_address(address.address).is_loopback
            ):
                return {"GLOO_SOCKET_IFNAME": name}
    return {}


def test_a_two_process_gloo_job_listens_on_the_loopback_only(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **outward_interface()}
    with (tmp_path / "node.log").open("w") as log:
        node = subprocess.Popen(
            [*local_command(2), str(script), str(tmp_path)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        up = [tmp_path / f"up-{rank}" for rank in range(2)]
        while not all(p.exists() for p in up):  # bounded by the test's timeout
            assert node.poll() is None, (tmp_path / "node.log").read_text()[-3000:]
            time.sleep(0.05)
        sockets = listening(psutil.Process(node.pid))
    finally:
        (tmp_path / "stop").touch()
    assert node.wait(timeout=60) == 0, (tmp_path / "node.log").read_text()[-3000:]

    workers = {int(p.read_text()) for p in up}
    assert {pid for pid, _, _ in sockets} == workers  # the agent listens nowhere
    assert len(sockets) >= 3  # rank 0's store, and gloo in each rank
    beyond = [s for s in sockets if not ipaddress.ip_address(s[1]).is_loopback]
    assert not beyond, f"listening beyond the loopback: {beyond}"
