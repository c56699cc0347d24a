#!/usr/bin/env python3
# File: tests/netns/link_probe.py — measures what a link between two network
# namespaces gives (round-trip time and TCP throughput), for tests/netns/run.sh
# to show that its shaping (delay, rate) is really in place. Python because
# the test machines have no ping and iperf3 is only in the bench dependencies.
#
#     link_probe.py serve ADDR PORT      UDP echo and TCP sink on ADDR:PORT until killed
#     link_probe.py measure ADDR PORT    against a server there; prints one line:
#         rtt_ms min=... avg=... max=... throughput_mbit=...
#
# measure exits 1 when the server does not answer.
import argparse
import select
import socket
import statistics
import sys
import threading
import time

RTT_SAMPLES = 20
RTT_SPACING_S = 0.02
RTT_REPLY_TIMEOUT_S = 1.0
# Links just set up may drop the first datagrams (neighbour discovery, a veth
# still coming up): the warm-up repeats one until it is echoed.
WARM_UP_TRIES = 25
WARM_UP_WAIT_S = 0.2
BULK_BYTES = 4 << 20
CHUNK_BYTES = 64 << 10


def echo_udp(sock):
    """Sends every datagram back to where it came from."""
    while True:
        payload, peer = sock.recvfrom(2048)
        sock.sendto(payload, peer)


def sink_tcp(listener):
    """Reads each connection to its end, then answers with one byte so the sender can time delivery."""
    while True:
        conn, _ = listener.accept()
        with conn:
            while conn.recv(CHUNK_BYTES):
                pass
            conn.sendall(b"k")


def serve(addr, port):
    """Runs the UDP echo and the TCP sink on addr:port until the process is killed."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((addr, port))
    tcp = socket.create_server((addr, port), reuse_port=False)
    threading.Thread(target=echo_udp, args=(udp,), daemon=True).start()
    print("ready", flush=True)
    sink_tcp(tcp)


def echoed(sock, payload, timeout_s):
    """Sends payload and waits up to timeout_s for the echo of that payload."""
    sock.send(payload)
    deadline = time.monotonic() + timeout_s
    while select.select([sock], [], [], max(0.0, deadline - time.monotonic()))[0]:
        if sock.recv(2048) == payload:
            return True
    return False


def round_trips_ms(addr, port):
    """RTT_SAMPLES UDP round trips in milliseconds, after a warm-up; raises TimeoutError when a reply is lost."""
    samples = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((addr, port))
        if not any(echoed(sock, b"warm-up", WARM_UP_WAIT_S) for _ in range(WARM_UP_TRIES)):
            raise TimeoutError(f"no echo from {addr}:{port}")
        for i in range(RTT_SAMPLES):
            start = time.monotonic()
            if not echoed(sock, i.to_bytes(4, "little"), RTT_REPLY_TIMEOUT_S):
                raise TimeoutError(f"no echo from {addr}:{port}")
            samples.append((time.monotonic() - start) * 1000.0)
            time.sleep(RTT_SPACING_S)
    return samples


def throughput_mbit(addr, port):
    """Sends BULK_BYTES over TCP and returns the rate at which the sink received them."""
    chunk = bytes(CHUNK_BYTES)
    with socket.create_connection((addr, port), timeout=30) as conn:
        start = time.monotonic()
        for _ in range(BULK_BYTES // CHUNK_BYTES):
            conn.sendall(chunk)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)  # the sink's answer: everything arrived
        elapsed = time.monotonic() - start
    return BULK_BYTES * 8 / elapsed / 1e6


def measure(addr, port):
    """Prints the RTT summary and the throughput of the link to addr:port."""
    try:
        rtt = round_trips_ms(addr, port)
        rate = throughput_mbit(addr, port)
    except OSError as e:
        print(f"link_probe: {e}", file=sys.stderr)
        return 1
    print(f"rtt_ms min={min(rtt):.3f} avg={statistics.fmean(rtt):.3f} max={max(rtt):.3f} "
          f"throughput_mbit={rate:.1f}", flush=True)
    return 0


def main():
    parser = argparse.ArgumentParser(description="RTT and TCP throughput between two namespaces.")
    parser.add_argument("mode", choices=("serve", "measure"))
    parser.add_argument("addr")
    parser.add_argument("port", type=int)
    args = parser.parse_args()
    if args.mode == "serve":
        serve(args.addr, args.port)
        return 0
    return measure(args.addr, args.port)


if __name__ == "__main__":
    sys.exit(main())
