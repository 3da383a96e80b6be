"""A TCP relay on loopback that delays every byte by a set one-way time.

Stands in for a network with a round-trip time (RTT = 2 x `delay_s`) where
the kernel's netem qdisc is not available (this project's CI kernels have no
sch_netem): it listens on one loopback address and port and forwards each
connection to a target, both directions, each chunk released `delay_s`
after it was read, in order. `delay_s` may change while connections are
open (a test measures the same client at 0 and at a set RTT). A relay thread
per direction reads; another sends, so a slow receiver does not stall reads
(within the kernel's socket buffers).
"""

from __future__ import annotations

import queue
import socket
import threading
import time


class DelayRelay:
    def __init__(self, listen: tuple[str, int], target: tuple[str, int],
                 delay_s: float = 0.0) -> None:
        self.target = target
        self.delay_s = delay_s
        self._listener = socket.create_server(listen)
        self.address = self._listener.getsockname()[:2]
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, server]
            self._pump(client, server)
            self._pump(server, client)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        pending: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

        def read() -> None:
            while True:
                try:
                    data = source.recv(1 << 20)
                except OSError:
                    data = b""
                pending.put((time.monotonic() + self.delay_s, data))
                if not data:
                    return

        def send() -> None:
            while True:
                due, data = pending.get()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    try:
                        sink.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    return
                try:
                    sink.sendall(data)
                except OSError:
                    return

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=send, daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
