#!/usr/bin/env python3
# File: tests/netns/delay_line.py — a user-space delay line for tests/netns/run.sh,
# standing in for `tc ... netem delay` on kernels built without sch_netem.
#
#     delay_line.py --delay-ms D IFACE_A:IFACE_B [IFACE_A:IFACE_B ...]
#
# Each IFACE_A:IFACE_B pair is one link cut in two: every frame received on
# one interface is sent out of the other D milliseconds later, in both
# directions, through AF_PACKET raw sockets (packet(7)). One process serves
# every pair with one select() loop; frames wait in one FIFO per direction,
# which is already ordered by due time because the delay is fixed.
#
# The interfaces must carry whole frames no larger than the MTU and with
# complete checksums: run.sh turns GSO, TSO, GRO and checksum offload off
# (ethtool -K) on every interface on the path before starting this.
#
# Prints "ready" once every socket is bound. On SIGTERM or SIGINT prints
# per-direction counts (forwarded, dropped) to stderr and exits 0.
import argparse
import collections
import errno
import select
import signal
import socket
import sys
import time

ETH_P_ALL = 0x0003
# <linux/socket.h> and <asm-generic/socket.h>; Python's socket module does not
# export them.
SOL_PACKET = 263
SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33
# packet(7): sll_pkttype of a frame this host transmitted on the interface.
PACKET_OUTGOING = 4
# packet(7), Linux 4.20: do not deliver outgoing frames to this socket at all.
PACKET_IGNORE_OUTGOING = 23
SOCKET_BUFFER_BYTES = 8 << 20
MAX_FRAME_BYTES = 65536
# Frames read from one socket per pass, so a busy direction cannot starve the
# sending of frames that are already due.
READ_BATCH = 64
# Longest wait in select() with nothing queued, so a stop signal is seen soon
# (PEP 475: select() resumes after a handler that does not raise).
IDLE_WAIT_S = 0.25


class Direction:
    """Frames read on `source` and due to be sent on `sink`, in arrival order."""

    def __init__(self, source_name, sink_name, source, sink):
        self.name = f"{source_name}->{sink_name}"
        self.source = source
        self.sink = sink
        self.queue = collections.deque()  # (due time, frame)
        self.forwarded = 0
        self.dropped = 0
        self.max_queued = 0


def open_raw_socket(ifname):
    """A non-blocking AF_PACKET socket bound to `ifname`, seeing every protocol."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    try:
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    except OSError:
        pass  # older kernels: receive() still skips them by sll_pkttype
    # The *FORCE variants pass net.core.{r,w}mem_max; run.sh runs this as root.
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, SOCKET_BUFFER_BYTES)
    sock.bind((ifname, ETH_P_ALL))
    sock.setblocking(False)
    return sock


def build_directions(pairs):
    """Two Directions per IFACE_A:IFACE_B pair, and a map from socket to the Direction it feeds."""
    directions, by_source = [], {}
    for pair in pairs:
        a_name, b_name = pair.split(":", 1)
        a, b = open_raw_socket(a_name), open_raw_socket(b_name)
        for d in (Direction(a_name, b_name, a, b), Direction(b_name, a_name, b, a)):
            directions.append(d)
            by_source[d.source] = d
    return directions, by_source


def receive(direction, delay_s):
    """Queues up to READ_BATCH frames waiting on the direction's source socket."""
    for _ in range(READ_BATCH):
        try:
            frame, address = direction.source.recvfrom(MAX_FRAME_BYTES)
        except BlockingIOError:
            return
        # address is (ifname, proto, pkttype, hatype, hwaddr); our own sends on
        # this interface come back as PACKET_OUTGOING and must not loop.
        if address[2] == PACKET_OUTGOING:
            continue
        direction.queue.append((time.monotonic() + delay_s, frame))
        direction.max_queued = max(direction.max_queued, len(direction.queue))


def send_due(directions, now):
    """Sends every frame whose time has come; returns the earliest due time still queued, or None."""
    earliest = None
    for d in directions:
        queue = d.queue
        while queue and queue[0][0] <= now:
            frame = queue.popleft()[1]
            try:
                d.sink.send(frame)
                d.forwarded += 1
            except OSError as e:
                # A full transmit path loses the frame, as a congested link would.
                if e.errno not in (errno.EAGAIN, errno.ENOBUFS):
                    raise
                d.dropped += 1
        if queue and (earliest is None or queue[0][0] < earliest):
            earliest = queue[0][0]
    return earliest


def report(directions):
    """Writes per-direction counters to stderr."""
    for d in directions:
        print(f"delay_line: {d.name} forwarded={d.forwarded} dropped={d.dropped} "
              f"max_queued={d.max_queued}", file=sys.stderr, flush=True)


def run(directions, by_source, delay_s):
    """The forwarding loop: wait for frames or the next due time, whichever comes first."""
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(True))
    sources = list(by_source)
    earliest = None
    print("ready", flush=True)
    while not stopping:
        # select() takes a timeout in microseconds, finer than epoll's milliseconds.
        timeout = IDLE_WAIT_S if earliest is None else max(0.0, earliest - time.monotonic())
        readable, _, _ = select.select(sources, [], [], timeout)
        for sock in readable:
            receive(by_source[sock], delay_s)
        earliest = send_due(directions, time.monotonic())
    report(directions)


def main():
    parser = argparse.ArgumentParser(description="Forwards frames between interface pairs after a fixed delay.")
    parser.add_argument("--delay-ms", type=float, required=True,
                        help="delay added to every frame, each direction")
    parser.add_argument("pairs", nargs="+", metavar="IFACE_A:IFACE_B")
    args = parser.parse_args()
    directions, by_source = build_directions(args.pairs)
    run(directions, by_source, args.delay_ms / 1000.0)


if __name__ == "__main__":
    main()
