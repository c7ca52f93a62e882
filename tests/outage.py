"""A TCP proxy in front of a real service that can take it away for a moment: while it is down,
open connections are cut and new ones are closed as soon as they arrive, as a client sees a
database or cache restarting behind a load balancer."""

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable


class Outage:
    """Forwards `127.0.0.1:<port>` to `target`; `down()` and `up()` switch the service off and
    on; `refused` counts the connections closed while it was down."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.refused = 0
        self._available = threading.Event()
        self._available.set()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = False
        self._watch_error: BaseException | None = None
        threading.Thread(target=self._accept, daemon=True).start()

    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def down(self) -> None:
        self._available.clear()
        with self._lock:
            for connection in self._open:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)

    def up(self) -> None:
        self._available.set()

    def up_when(self, effect: Callable[[], bool], poll_s: float = 0.2) -> threading.Thread:
        """Come back once `effect()` holds (polled in a thread): the outage ends when what it
        was meant to cause has been seen, however long that takes on a busy machine. Should
        `effect()` raise, the service comes back and `close()` raises that error."""

        def wait() -> None:
            try:
                while not self._closed and not effect():
                    time.sleep(poll_s)
            except BaseException as error:
                self._watch_error = error
            finally:
                self.up()

        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self._closed = True
        self.down()
        self._listener.close()
        if self._watch_error is not None:
            raise RuntimeError("watching for the outage's effect failed") from self._watch_error

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._available.is_set():
                self.refused += 1
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        with self._lock:
            self._open |= {client, server}
        peers = {client: server, server: client}
        try:
            while self._available.is_set():
                ready, _, _ = select.select(list(peers), [], [], 0.2)
                for source in ready:
                    data = source.recv(65536)
                    if not data:
                        return
                    peers[source].sendall(data)
        except OSError:
            return
        finally:
            with self._lock:
                self._open -= {client, server}
            for end in (client, server):
                with contextlib.suppress(OSError):
                    end.close()
