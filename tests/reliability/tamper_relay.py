#!/usr/bin/env python3
"""A transparent attacker on the path of a job's TCP data connections.

    tamper_relay.py --attack flip|replay|drop|reorder|truncate|droptail|none
                    [--port P] [--mark M] [--after BYTES] [--big BYTES]
                    [--chunk BYTES] [--seed S] [--seconds S]
                    [--arm-file PATH]...

run_tamper.sh starts it in namespace A, where an nftables nat rule
redirects the job's connections towards namespace B to 127.0.0.1:P. For
each connection it accepts, it reads where the connection was going
(SO_ORIGINAL_DST), connects there itself, with SO_MARK set to M so that
the rule lets its own connection through, and forwards both directions.

Once every --arm-file exists (run_tamper.sh: each rank creates one when
its hvd_init has returned, so that the traffic of the start, which
measures the links with megabytes, is left alone), one direction of one
connection is past its handshake (more than --after bytes forwarded) and
a single read brings at least --big bytes (the middle of a large
payload), it applies the attack there, once in all
(to the first stream that gets there), at a random offset O of that read:

  flip      XOR the byte at O with a random non-zero value
  replay    send the --chunk bytes before O a second time
  drop      leave out the --chunk bytes from O
  reorder   swap the --chunk bytes from O with the --chunk bytes after
  truncate  forward up to O, then close both sides of the connection
  droptail  leave out the last --chunk bytes of such a read when nothing
            follows them within 0.5 s: the end of what the sender sends
            before it waits for the receiver, a gap that only the
            sender's heartbeats come to fill
  none      forward everything unchanged (the harness's own check)

It prints what it did and at which offset of which stream:

  ATTACK flip conn 2 10.48.4.1:40000->10.48.4.2:41000 offset 1234567 ...

and, per connection, how many bytes went each way. Every loop is bounded:
the relay ends by itself after --seconds (default 60).
"""

import argparse
import os
import random
import select
import signal
import socket
import struct
import sys
import threading
import time

SO_ORIGINAL_DST = 80
SO_MARK = 36
READ_MAX = 256 * 1024
# droptail: how long a stream must stay quiet after a read for the read's
# end to count as the end of what its sender sends before it waits.
TAIL_QUIET_S = 0.5

ATTACKS = ("flip", "replay", "drop", "reorder", "truncate", "droptail", "none")


def say(text):
    print("relay: " + text, flush=True)


class Attack:
    """The one attack of this run: which stream takes it, and where."""

    def __init__(self, kind, after, big, chunk, seed, arm_files):
        self.kind = kind
        self.after = after
        self.arm_files = arm_files
        self.armed = not arm_files
        self.big = big
        self.chunk = chunk
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.done = kind == "none"

    def may_strike(self, stream_pos, nbytes):
        """Whether a read of nbytes at stream_pos is one to strike."""
        if self.done or stream_pos < self.after or nbytes < self.big:
            return False
        if not self.armed:
            self.armed = all(os.path.exists(f) for f in self.arm_files)
        return self.armed

    def claim(self, stream_pos, nbytes):
        """True once: for the first read past the handshake that is big."""
        if not self.may_strike(stream_pos, nbytes):
            return False
        with self.lock:
            if self.done:
                return False
            self.done = True
            return True

    def apply(self, data, stream_pos, name):
        """The bytes to forward instead of data, and whether to close."""
        n = len(data)
        c = self.chunk
        at = self.rng.randrange(c, n - 2 * c)
        off = stream_pos + at
        if self.kind == "flip":
            mask = self.rng.randrange(1, 256)
            out = bytearray(data)
            out[at] ^= mask
            say(
                "ATTACK flip %s offset %d wall %.6f: byte 0x%02x xor 0x%02x "
                "= 0x%02x" % (name, off, time.time(), data[at], mask, out[at])
            )
            return bytes(out), False
        if self.kind == "replay":
            say(
                "ATTACK replay %s offset %d wall %.6f: the %d bytes before "
                "it (offsets %d-%d) sent again"
                % (name, off, time.time(), c, off - c, off - 1)
            )
            return data[:at] + data[at - c : at] + data[at:], False
        if self.kind == "drop":
            say(
                "ATTACK drop %s offset %d wall %.6f: %d bytes (offsets "
                "%d-%d) left out" % (name, off, time.time(), c, off, off + c - 1)
            )
            return data[:at] + data[at + c :], False
        if self.kind == "reorder":
            say(
                "ATTACK reorder %s offset %d wall %.6f: the %d bytes there "
                "swapped with the %d after" % (name, off, time.time(), c, c)
            )
            return (
                data[:at] + data[at + c : at + 2 * c] + data[at : at + c]
                + data[at + 2 * c :],
                False,
            )
        say(
            "ATTACK truncate %s offset %d wall %.6f: forwarded up to there, "
            "then closed both sides" % (name, off, time.time())
        )
        return data[:at], True


def original_dst(sock):
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, addr = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(addr), port


class Conn:
    def __init__(self, num, client, attack, mark):
        self.num = num
        self.client = client
        self.attack = attack
        self.mark = mark
        self.server = None
        self.lock = threading.Lock()
        self.closed = False
        self.moved = {}

    def close(self):
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for s in (self.client, self.server):
            if s is None:
                continue
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def drop_tail(self, src, dst, data, pos, name):
        """droptail: forwards data but for its last --chunk bytes; drops
        those if nothing follows within TAIL_QUIET_S (the end of what the
        sender sends before it waits), else forwards them too. Returns the
        new stream position."""
        c = self.attack.chunk
        if not self.attack.may_strike(pos, len(data)):
            dst.sendall(data)
            return pos + len(data)
        dst.sendall(data[:-c])
        quiet = not select.select([src], [], [], TAIL_QUIET_S)[0]
        if quiet and self.attack.claim(pos, len(data)):
            off = pos + len(data) - c
            say(
                "ATTACK droptail %s offset %d wall %.6f: the last %d bytes "
                "before the sender went quiet (offsets %d-%d) left out"
                % (name, off, time.time(), c, off, off + c - 1)
            )
        else:
            dst.sendall(data[-c:])
        return pos + len(data)

    def pump(self, src, dst, name):
        pos = 0
        try:
            while True:
                data = src.recv(READ_MAX)
                if not data:
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    break
                close = False
                if self.attack.kind == "droptail":
                    pos = self.drop_tail(src, dst, data, pos, name)
                    continue
                if self.attack.claim(pos, len(data)):
                    out, close = self.attack.apply(data, pos, name)
                else:
                    out = data
                pos += len(data)
                dst.sendall(out)
                if close:
                    self.close()
                    break
        except OSError:
            self.close()
        self.moved[name] = pos

    def run(self):
        try:
            host, port = original_dst(self.client)
            peer = self.client.getpeername()
            self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.server.setsockopt(socket.SOL_SOCKET, SO_MARK, self.mark)
            self.server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.server.settimeout(10)
            self.server.connect((host, port))
            self.server.settimeout(None)
        except OSError as e:
            say("conn %d: could not reach its destination: %s" % (self.num, e))
            self.close()
            return
        up = "conn %d %s:%d->%s:%d" % (self.num, peer[0], peer[1], host, port)
        down = "conn %d %s:%d->%s:%d" % (self.num, host, port, peer[0], peer[1])
        say("conn %d: %s:%d to %s:%d" % (self.num, peer[0], peer[1], host, port))
        t = threading.Thread(
            target=self.pump, args=(self.server, self.client, down), daemon=True
        )
        t.start()
        self.pump(self.client, self.server, up)
        t.join()
        self.close()
        say(
            "conn %d done: %d bytes %s:%d->%s:%d, %d bytes back"
            % (
                self.num,
                self.moved.get(up, 0),
                peer[0],
                peer[1],
                host,
                port,
                self.moved.get(down, 0),
            )
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attack", required=True, choices=ATTACKS)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--mark", type=lambda s: int(s, 0), default=0x4856)
    ap.add_argument("--after", type=int, default=4096)
    ap.add_argument("--big", type=int, default=32768)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--arm-file", action="append", default=[])
    args = ap.parse_args()
    if args.big < 3 * args.chunk + 1:
        ap.error("--big must exceed three --chunk")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    attack = Attack(
        args.attack, args.after, args.big, args.chunk, seed, args.arm_file
    )
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", args.port))
    lsock.listen(64)
    say(
        "listening on 127.0.0.1:%d, attack %s, seed %d"
        % (lsock.getsockname()[1], args.attack, seed)
    )
    deadline = time.monotonic() + args.seconds
    num = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([lsock], [], [], min(left, 1.0))
        if not ready:
            continue
        client, _ = lsock.accept()
        num += 1
        conn = Conn(num, client, attack, args.mark)
        threading.Thread(target=conn.run, daemon=True).start()
    say("ran its %g s; exiting" % args.seconds)


if __name__ == "__main__":
    main()
