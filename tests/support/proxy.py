"""A TCP forwarder the tests can cut: a network partition between one client and a real server.

`Partition(port)` listens on `.port` and forwards each connection to 127.0.0.1:`port`. After
`cut()` it forwards nothing, either way, while both sockets stay open: the client's sends succeed
and go nowhere, as on a dead link. A side that closes still closes the other, so a client killed
behind a cut link is seen by the server as a dropped connection, as it would be without the proxy.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Partition:
    def __init__(self, port: int) -> None:
        self._target = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._cut = threading.Event()
        threading.Thread(target=self._accept, name="partition-accept", daemon=True).start()

    def cut(self) -> None:
        """Forward nothing more on any connection, from now on."""
        self._cut.set()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self._target))
            except OSError:
                return
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), name="partition-pipe", daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if not self._cut.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        finally:  # one side closed (or failed): so does the other, whatever the cut
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            src.close()  # each socket is the source of one pipe: closed once
