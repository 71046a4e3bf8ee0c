"""The floor under the gateway's CPU per delivered frame: one `send()` of a frame to a
loopback TCP connection, with nothing else around it.

Run from the repository root: `.venv/bin/python -m bench.write_floor [--connections 2000]
[--events 20] [--rounds 5] [--frame-bytes 180]`.

This process accepts `--connections` loopback TCP connections from a child process that reads
them all; then, per round, it sends `--events` frames of `--frame-bytes` to every connection,
one `send()` each, as the gateway writes one event to each of its viewers, and prints its own
CPU (user and system: on loopback the kernel's receiving work runs in the sender's system
call) per send, the median of `--rounds`. It prints the same for two frames in one send, what
a viewer costs when two events share a write.
"""

from __future__ import annotations

import argparse
import multiprocessing
import selectors
import socket
import statistics
import time
from collections.abc import Sequence
from typing import Any


def _read_all(port: int, connections: int) -> None:
    """The child: connect every client, then read until each one is closed."""
    selector = selectors.DefaultSelector()
    for _ in range(connections):
        client = socket.create_connection(("127.0.0.1", port))
        client.setblocking(False)
        selector.register(client, selectors.EVENT_READ)
    open_ = connections
    while open_:
        for key, _ in selector.select():
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            try:
                data = sock.recv(1 << 16)
            except BlockingIOError:
                continue
            if not data:
                selector.unregister(sock)
                sock.close()
                open_ -= 1


def _cpu_per_send(sockets: list[socket.socket], payload: bytes, sends: int) -> float:
    started = time.process_time()
    for _ in range(sends):
        for sock in sockets:
            sock.send(payload)
        # Gives the reader a moment, as events 50 ms apart would.
        time.sleep(0.002)
    return 1e6 * (time.process_time() - started) / (sends * len(sockets))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    listener = socket.create_server(("127.0.0.1", 0), backlog=args.connections)
    port = listener.getsockname()[1]
    reader = multiprocessing.get_context("spawn").Process(
        target=_read_all, args=(port, args.connections)
    )
    reader.start()
    sockets = [listener.accept()[0] for _ in range(args.connections)]
    for sock in sockets:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    frame = b"x" * args.frame_bytes
    one, two = [], []
    for _ in range(args.rounds):
        one.append(_cpu_per_send(sockets, frame, args.events))
        two.append(_cpu_per_send(sockets, frame * 2, args.events // 2))
    for sock in sockets:
        sock.close()
    reader.join()
    print(
        f"{args.connections:,} loopback connections, {args.frame_bytes}-byte frames: "
        f"CPU per send of one frame {statistics.median(one):.2f} us "
        f"(rounds {', '.join(f'{f:.2f}' for f in one)}); "
        f"of two frames in one send {statistics.median(two):.2f} us"
    )
    return 0


def _parse(argv: Sequence[str] | None) -> Any:
    parser = argparse.ArgumentParser(prog="python -m bench.write_floor")
    parser.add_argument("--connections", type=int, default=2_000)
    parser.add_argument("--events", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--frame-bytes", type=int, default=180)
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
