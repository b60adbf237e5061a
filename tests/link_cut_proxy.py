"""A TCP proxy in front of one Redis that can cut the replication link and nothing else.

``python link_cut_proxy.py LISTEN_PORT TARGET_PORT`` forwards every connection both ways. After
SIGUSR1, bytes from the server to a replica (a connection whose client sent ``REPLCONF`` or
``PSYNC``) are dropped: the replica stays connected and hears nothing more, while clients are
served as before; that is a primary acknowledging writes its replica never gets (there is no
healing: the dropped bytes leave the replication stream cut mid-command). SIGTERM exits. Run as
its own process (the test's threads would contend with it for the GIL, which would show up as
read latency).
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import sys

REPLICA_COMMANDS = (b"REPLCONF", b"PSYNC", b"SYNC")


def main(listen_port: int, target_port: int) -> None:
    state = {"cut": False, "running": True}

    def cut(*_: object) -> None:
        state["cut"] = True

    def stop(*_: object) -> None:
        state["running"] = False

    signal.signal(signal.SIGUSR1, cut)
    signal.signal(signal.SIGTERM, stop)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", listen_port))
    listener.listen(64)
    peer: dict[socket.socket, socket.socket] = {}
    from_client: set[socket.socket] = set()
    replication: set[socket.socket] = set()  # client sides of replication links
    print("ready", flush=True)

    def close(sock: socket.socket) -> None:
        other = peer.pop(sock, None)
        for s in (sock, other):
            if s is None:
                continue
            peer.pop(s, None)
            from_client.discard(s)
            replication.discard(s)
            with contextlib.suppress(OSError):
                s.close()

    while state["running"]:
        try:
            ready, _, _ = select.select([listener, *peer], [], [], 0.05)
        except InterruptedError:
            continue
        for sock in ready:
            if sock is listener:
                client, _ = listener.accept()
                try:
                    server = socket.create_connection(("127.0.0.1", target_port), timeout=1)
                except OSError:
                    client.close()
                    continue
                server.settimeout(None)
                peer[client], peer[server] = server, client
                from_client.add(client)
                continue
            if sock not in peer:
                continue  # closed earlier in this pass
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                close(sock)
                continue
            if sock in from_client:
                if any(c in data.upper() for c in REPLICA_COMMANDS):
                    replication.add(sock)
            elif state["cut"] and peer[sock] in replication:
                continue  # dropped: the replica never hears of it
            try:
                peer[sock].sendall(data)
            except OSError:
                close(sock)
    for sock in list(peer):
        close(sock)
    listener.close()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
