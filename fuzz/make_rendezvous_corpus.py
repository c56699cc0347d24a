#!/usr/bin/env python3
"""Writes seed scripts for fuzz/rendezvous_fuzz.cpp into fuzz/corpus/rendezvous_fuzz/.

Each seed is a valid session of the script language described at the top of
rendezvous_fuzz.cpp: 3 ranks with token "fuzz-token" doing set/get/wait,
all_gather and barrier, plus a few hostile openings. Encoding follows
include/pdcoll/bootstrap/wire.hpp.
"""
import os
import struct
import sys

HELLO, SET, GET, WAIT, COLLECT, STATUS, ERASE = 1, 2, 3, 4, 5, 6, 7


def frame(body: bytes) -> bytes:
    return struct.pack("<I", len(body)) + body


def short(b: bytes) -> bytes:
    return struct.pack("<H", len(b)) + b


def long_(b: bytes) -> bytes:
    return struct.pack("<I", len(b)) + b


def hello(rank, token=b"fuzz-token", world=3):
    return frame(bytes([HELLO]) + short(token) + struct.pack("<II", rank, world))


def set_(key, value):
    return frame(bytes([SET]) + short(key) + long_(value))


def get(key):
    return frame(bytes([GET]) + short(key))


def wait(key):
    return frame(bytes([WAIT]) + short(key))


def erase(prefix):
    return frame(bytes([ERASE]) + short(prefix))


def collect(rnd, kind, value=b""):
    return frame(bytes([COLLECT]) + struct.pack("<IB", rnd, kind) + long_(value))


def status(rnd):
    return frame(bytes([STATUS]) + struct.pack("<I", rnd))


OPEN, FEED, CLOSE, TICK, DRAIN, DRAIN_ALL = 0, 1, 2, 3, 4, 5


def feed(k, payload):
    return bytes([FEED, k]) + struct.pack("<H", len(payload)) + payload


def script(*ops):
    return b"".join(ops)


def three_ranks():
    return bytes([OPEN, OPEN, OPEN]) + feed(0, hello(0)) + feed(1, hello(1)) + feed(2, hello(2))


SEEDS = {
    "gather_barrier": script(three_ranks(),
                             feed(0, collect(0, 0, b"addr-0")), feed(1, collect(0, 0, b"addr-1")),
                             feed(2, collect(0, 0, b"addr-2")), bytes([DRAIN_ALL]),
                             feed(0, collect(1, 1)), feed(1, collect(1, 1)), feed(2, collect(1, 1)),
                             bytes([DRAIN_ALL])),
    "set_get_wait": script(three_ranks(), feed(1, get(b"k")), feed(2, wait(b"k")),
                           feed(0, set_(b"k", b"value")), bytes([DRAIN_ALL])),
    "erase_prefix": script(three_ranks(), feed(0, set_(b"split/0/0/0/0", b"v1")), feed(1, set_(b"split/0/0/0/1", b"v2")),
                           feed(2, set_(b"split/10/0", b"v3")), bytes([DRAIN_ALL]), feed(0, erase(b"split/0/")),
                           feed(1, get(b"split/0/0/0/0")), feed(2, get(b"split/10/0")), bytes([DRAIN_ALL])),
    "status_while_waiting": script(three_ranks(), feed(0, collect(0, 0, b"x")), feed(0, status(0)),
                                   bytes([TICK, 40, DRAIN_ALL])),
    "rank_leaves": script(three_ranks(), feed(0, collect(0, 1)), bytes([CLOSE, 2, DRAIN_ALL])),
    "kind_mismatch": script(three_ranks(), feed(0, collect(0, 1)), feed(1, collect(0, 0, b"y")),
                            bytes([DRAIN_ALL])),
    "wrong_token": script(bytes([OPEN]), feed(0, hello(0, b"nope")), bytes([DRAIN_ALL])),
    "joined_twice": script(bytes([OPEN, OPEN]), feed(0, hello(1)), feed(1, hello(1)), bytes([DRAIN_ALL])),
    "silent_client": script(bytes([OPEN, TICK, 200, DRAIN_ALL])),
    "split_frames": script(bytes([OPEN]), feed(0, hello(0)[:3]), feed(0, hello(0)[3:]),
                           feed(0, set_(b"a", b"b" * 100)), bytes([DRAIN, 0, 1, DRAIN_ALL])),
    "oversized_length": script(bytes([OPEN]), feed(0, struct.pack("<I", 0xFFFFFFF0) + b"\x01"),
                               bytes([DRAIN_ALL])),
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus", "rendezvous_fuzz")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
