#!/usr/bin/env python3
"""An intruder against an hvd job (run_intruder.sh); Python 3 stdlib only.

    intruder.py rdv|data|late DIR

Knocks on the job's rendezvous (rdv), on a rank's data listener (data) or,
once the job runs, on both again (late), in every way a stranger could:

  silent        connects and closes at once
  garbage       a hello's length of random bytes
  huge-length   a 4-byte length prefix of 0xffffffff, as if the handshake
                were skipped, then zeros
  wrong-job     a well-formed hello of another job
  no-secret     a hello of this job, then a response without a proof
  wrong-secret  a hello of this job, then a proof made with another secret
  replay        the hello and response of an honest handshake recorded
                before (forged here with the job's secret, as an
                eavesdropper would have recorded them), replayed on a new
                connection: the server's fresh nonce makes the proof stale
  half-frame    a frame header (the data stream's "HV" magic, a huge
                length) in place of a hello, then nothing: it stalls
  half-hello    half a hello, then nothing: it stalls
  flood         40 connections that send nothing and stay open while the
                slow rank joins (the server must keep room for it)

The rdv and data stages run the quick attacks, then the flood (data also
the stalling ones), then let the slow rank go on; the late stage runs the
quick attacks and the stalling ones, which the rendezvous drops after its
10 s handshake limit.

Each attack prints "ATTACK <name> <local port> <outcome>" where the
outcome says how the server answered: "refused:<code>" (a refusal
message), "closed" (it closed the connection), "open" (still open: a
failure, except for flood). The late stage also checks that the data port
of stage "data" no longer listens ("ATTACK closed-port ... refused-connect").
DIR holds job ("JOBID SECRET SLOW_RANK"), rdv.addr and data.addr
("ADDR PORT"). Exit status: 0 when every attack was turned away as it
should be, 1 otherwise.
"""
import hashlib
import hmac
import os
import socket
import struct
import sys
import threading
import time

MAGIC = 0x48564448
VERSION = 2
KIND_RDV, KIND_DATA = 1, 2
HELLO_LEN, CHALLENGE_LEN, RESPONSE_LEN, RESULT_LEN = 68, 80, 40, 8
CODES = {0: "ok", 1: "bad-version", 2: "wrong-job", 3: "unexpected",
         4: "bad-proof"}
# The servers drop a stranger that has not finished the handshake in
# 10 s; a data listener also closes when its mesh is complete.
STALL_WAIT_S = 20

failures = []
lock = threading.Lock()


def report(name, port, outcome, ok):
    with lock:
        print(f"ATTACK {name} {port} {outcome}{'' if ok else ' FAIL'}",
              flush=True)
        if not ok:
            failures.append(name)


def read_exact(sock, n, timeout):
    """Up to n bytes; fewer if the peer closes; None on timeout."""
    sock.settimeout(timeout)
    buf = b""
    try:
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                break
            buf += chunk
    except socket.timeout:
        return None
    except ConnectionResetError:
        pass
    return buf


def hello(job_id, kind, rank, index, nonce=None):
    nonce = nonce if nonce is not None else os.urandom(32)
    # Then the frame protection (HVD_TCP_PROTECT: 0 none) and 2 reserved
    # bytes; a stranger is refused before it matters.
    return (struct.pack("<IHH", MAGIC, VERSION, kind) + job_id +
            struct.pack("<II", rank, index) + nonce + struct.pack("<HH", 0, 0))


def connect(addr, port):
    s = socket.create_connection((addr, port), timeout=10)
    return s, s.getsockname()[1]


def outcome_of(data):
    """What a server's reply (or silence) means."""
    if data is None:
        return "open"
    if len(data) >= 8 and struct.unpack("<I", data[:4])[0] == MAGIC:
        code = struct.unpack("<I", data[4:8])[0]
        if code != 0:
            return "refused:" + CODES.get(code, str(code))
        return "accepted"
    return "closed"


def expect_turned_away(name, addr, port, payload, wait=10.0):
    """Sends payload, then expects a refusal or the connection closed."""
    s, lport = connect(addr, port)
    try:
        if payload:
            s.sendall(payload)
        out = outcome_of(read_exact(s, CHALLENGE_LEN, wait))
    finally:
        s.close()
    report(name, lport, out, out.startswith("refused") or out == "closed")


def attack_silent(addr, port, **_):
    s, lport = connect(addr, port)
    s.close()
    # Nothing to read back: the server logs the connection it lost.
    report("silent", lport, "closed", True)


def attack_garbage(addr, port, **_):
    expect_turned_away("garbage", addr, port, os.urandom(HELLO_LEN))


def attack_huge_length(addr, port, **_):
    expect_turned_away("huge-length", addr, port,
                       b"\xff\xff\xff\xff" + bytes(HELLO_LEN - 4))


def attack_wrong_job(addr, port, kind, slow, **_):
    expect_turned_away("wrong-job", addr, port,
                       hello(os.urandom(16), kind, slow, 0))


def proof_exchange(name, addr, port, h, make_response):
    """Sends hello h, reads the challenge, sends make_response(challenge),
    and expects the server to refuse the proof."""
    s, lport = connect(addr, port)
    try:
        s.sendall(h)
        ch = read_exact(s, CHALLENGE_LEN, 10.0)
        if ch is None or len(ch) < CHALLENGE_LEN or \
                struct.unpack("<I", ch[4:8])[0] != 0:
            # Refused already at the hello: fine as well (e.g. the rank
            # it claims has joined).
            out = outcome_of(ch)
            report(name, lport, out, out != "open")
            return
        s.sendall(make_response(ch))
        res = read_exact(s, RESULT_LEN, 10.0)
        out = outcome_of(res)
    finally:
        s.close()
    report(name, lport, out, out.startswith("refused") or out == "closed")


def response(secret, h, ch):
    nonce_s, mac_s = ch[16:48], ch[48:80]
    mac_c = hmac.new(secret, b"hvd-cli" + h + nonce_s + mac_s,
                     hashlib.sha256).digest()
    return struct.pack("<II", MAGIC, 0) + mac_c


def attack_no_secret(addr, port, job_id, kind, slow, **_):
    proof_exchange("no-secret", addr, port, hello(job_id, kind, slow, 0),
                   lambda ch: struct.pack("<II", MAGIC, 0) + bytes(32))


def attack_wrong_secret(addr, port, job_id, kind, slow, secret, **_):
    h = hello(job_id, kind, slow, 0)
    proof_exchange("wrong-secret", addr, port, h,
                   lambda ch: response(secret + b"x", h, ch))


def attack_replay(addr, port, job_id, kind, slow, secret, **_):
    # The recording: an honest client's hello and response. The response is
    # made but never sent, so that the job's slot is not taken.
    h = hello(job_id, kind, slow, 0)
    s, _lport = connect(addr, port)
    try:
        s.sendall(h)
        ch = read_exact(s, CHALLENGE_LEN, 10.0)
    finally:
        s.close()
    if ch is None or len(ch) < CHALLENGE_LEN:
        report("replay", _lport, "no-challenge-to-record", False)
        return
    recorded = response(secret, h, ch)
    proof_exchange("replay", addr, port, h, lambda _ch: recorded)


def stall(name, addr, port, payload):
    s, lport = connect(addr, port)
    s.sendall(payload)
    t0 = time.monotonic()
    data = read_exact(s, CHALLENGE_LEN, STALL_WAIT_S)
    s.close()
    out = outcome_of(data)
    report(name, lport, f"{out} after {time.monotonic() - t0:.1f} s",
           out != "open")


def attack_half_frame(addr, port, **_):
    hdr = struct.pack("<HBBIQQ", 0x4856, 1, 0, 0, 1 << 40, 1 << 40)
    stall("half-frame", addr, port, hdr)


def attack_half_hello(addr, port, job_id, kind, slow, **_):
    stall("half-hello", addr, port, hello(job_id, kind, slow, 0)[:32])


def flood_open(addr, port, n=40):
    socks = []
    for _ in range(n):
        try:
            s, _lport = connect(addr, port)
            socks.append(s)
        except OSError:
            break
    return socks


def flood_close(socks):
    """How many of the flood's connections the server had closed."""
    closed = 0
    for s in socks:
        if read_exact(s, 1, 0.01) is not None:
            closed += 1
        s.close()
    return closed


def read_addr(path):
    with open(path) as f:
        a, p = f.read().split()
    return a, int(p)


def main():
    stage, d = sys.argv[1], sys.argv[2]
    with open(os.path.join(d, "job")) as f:
        job_hex, secret, slow = f.read().split()
    args = dict(job_id=bytes.fromhex(job_hex), secret=secret.encode(),
                slow=int(slow))
    quick = [attack_silent, attack_garbage, attack_huge_length,
             attack_wrong_job, attack_no_secret, attack_wrong_secret,
             attack_replay]
    stalls = [attack_half_frame, attack_half_hello]

    if stage in ("rdv", "data"):
        addr, port = read_addr(os.path.join(d, stage + ".addr"))
        args.update(addr=addr, port=port,
                    kind=KIND_RDV if stage == "rdv" else KIND_DATA)
        for attack in quick:
            attack(**args)
        # A flood (and, at a data port, the stalling ones) stays while the
        # slow rank proceeds.
        threads = []
        if stage == "data":
            threads = [threading.Thread(target=a, kwargs=args)
                       for a in stalls]
        for t in threads:
            t.start()
        socks = flood_open(addr, port)
        print(f"FLOOD {len(socks)} idle connections open", flush=True)
        open(os.path.join(d, stage + ".go"), "w").close()
        for t in threads:
            t.join()
        print(f"FLOOD {flood_close(socks)} of {len(socks)} closed by the "
              f"server", flush=True)
    else:
        addr, port = read_addr(os.path.join(d, "rdv.addr"))
        args.update(addr=addr, port=port, kind=KIND_RDV)
        for attack in quick:
            attack(**args)
        # Rank 0 has joined: a proof for it is refused at the hello.
        args["slow"] = 0
        attack_wrong_secret(**args)
        # Strangers that stall are dropped after 10 s, while the job runs.
        threads = [threading.Thread(target=a, kwargs=args) for a in stalls]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # The data listener is gone once the mesh is up.
        daddr, dport = read_addr(os.path.join(d, "data.addr"))
        try:
            s, lport = connect(daddr, dport)
            s.close()
            report("closed-port", lport, "connected", False)
        except ConnectionRefusedError:
            report("closed-port", dport, "refused-connect", True)
        open(os.path.join(d, "done"), "w").close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
