"""Training on one machine with nothing listening beyond it.

torchrun's `--standalone` listens on every interface, without authentication: its rendezvous is a
TCPStore in the agent, rank 0 hosts another for the workers (a TCPStore's host name is only
where clients connect; its server binds the wildcard address), and gloo's pairs listen on the
address the machine's hostname resolves to. On one machine none of that needs to be reachable
from another, so `python -m ml.node --standalone` runs it like this instead (`standalone`):

- the rendezvous in a file (torchrun's c10d rendezvous with `store_type=file`), no port at all;
- the workers told MASTER_ADDR=127.0.0.1 (`--local-addr`), and rank 0's store on a socket bound
  to that address (`worker_store`, from `ml.train.process_group`);
- gloo on the loopback interface (GLOO_SOCKET_IFNAME).

A job over several machines (the Kubernetes launchers' `--rdzv-endpoint`) is left as torch runs it.
"""

import argparse
import ipaddress
import os
import socket
import uuid
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed import Store

LOOPBACK = "127.0.0.1"
LOOPBACK_INTERFACE = "lo"
"""Linux's name for the loopback interface, where gloo binds (it takes an interface, not an
address)."""


def standalone(args: argparse.Namespace, folder: Path) -> None:
    """Turn torchrun's parsed `--standalone` arguments into a one-machine job whose rendezvous
    is a file in `folder` and whose workers listen on the loopback only; sets the variables the
    workers inherit."""
    args.standalone = False
    args.nnodes = "1"
    args.rdzv_backend = "c10d"
    args.rdzv_endpoint = str(folder / "rendezvous")
    args.rdzv_conf = ",".join(c for c in (args.rdzv_conf, "store_type=file") if c)
    args.rdzv_id = str(uuid.uuid4())
    args.local_addr = LOOPBACK
    # Shared, the agent would host the workers' store itself, on every interface.
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    os.environ["GLOO_SOCKET_IFNAME"] = LOOPBACK_INTERFACE


def worker_store(rank: int, world_size: int, timeout: timedelta) -> "Store | None":
    """The workers' store when torchrun told them a loopback MASTER_ADDR: rank 0 hosts it on a
    socket bound to that address, the others connect. None otherwise (torch's env:// store)."""
    from torch.distributed import TCPStore

    address = _loopback(os.environ.get("MASTER_ADDR", ""))
    if address is None:
        return None
    host, port = str(address), int(os.environ["MASTER_PORT"])
    listening = None
    if rank == 0:
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        listening = socket.create_server((host, port), family=family).detach()
    return TCPStore(
        host, port, world_size, is_master=rank == 0, timeout=timeout, master_listen_fd=listening
    )


def _loopback(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`host` if it is a loopback IP address (a name is not resolved), else None."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return address if address.is_loopback else None
