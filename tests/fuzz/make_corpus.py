#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets: tests/fuzz/corpus/<target>/.

    tests/fuzz/make_corpus.py

Each seed is a well-formed input (or a classic near miss) in the layout the
target's comment describes, so that the fuzzer starts from messages that
get past the first checks. The files are named after what they hold and
are committed; run this again after changing a layout. Python 3 stdlib.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- protobuf by hand (proto3 wire format) ----

def varint(v):
    out = b""
    v &= (1 << 64) - 1
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field_varint(num, v):
    return varint(num << 3) + varint(v)


def field_bytes(num, b):
    return varint(num << 3 | 2) + varint(len(b)) + b


def field_double(num, v):
    return varint(num << 3 | 1) + struct.pack("<d", v)


def packed(num, values):
    return field_bytes(num, b"".join(varint(v) for v in values))


def request(name, kind=0, dtype=6, op=0, root=0, counts=(10,), age=0.01):
    return (field_bytes(1, name.encode()) + field_varint(2, kind) +
            field_varint(3, dtype) + field_varint(4, op) +
            field_varint(5, root) + packed(6, counts) + field_double(7, age))


def update(requests=(), seen=0, ready=(), invalidate=(), stop=False):
    m = field_varint(1, seen)
    if ready:
        m += packed(2, ready)
    if invalidate:
        m += packed(3, invalidate)
    for r in requests:
        m += field_bytes(4, r)
    if stop:
        m += field_varint(5, 1)
    return m


def response(name, kind=0, dtype=6, op=0, root=0, counts=(10,), status=0,
             error="", contributors=4, last_joined=-1, joined=()):
    m = (field_varint(1, kind) + field_bytes(2, name.encode()) +
         field_varint(3, dtype) + field_varint(4, op) + field_varint(5, root) +
         packed(6, counts) + field_varint(7, status) +
         field_bytes(8, error.encode()) + field_varint(9, contributors) +
         field_varint(10, last_joined))
    if joined:
        m += packed(11, joined)
    return m


def cycle(number, run=(), erase=(), responses=(), paused=False, stop=False):
    m = field_varint(1, number)
    if run:
        m += packed(2, run)
    if erase:
        m += packed(3, erase)
    for r in responses:
        m += field_bytes(4, r)
    if paused:
        m += field_varint(5, 1)
    if stop:
        m += field_varint(6, 1)
    return m


def records(size_byte, recs):
    out = bytes([size_byte])
    for rank, msg in recs:
        out += bytes([rank]) + struct.pack("<H", len(msg)) + msg
    return out


def ctrl():
    a = request("grad.a")
    write("ctrl", "update-agree", bytes([0]) + records(2, [(0, update([a])),
                                                          (1, update([a])),
                                                          (2, update([a])),
                                                          (3, update([a]))]))
    write("ctrl", "update-mismatch", bytes([0]) + records(
        0, [(0, update([request("w", counts=(10,))])),
            (1, update([request("w", counts=(11,))]))]))
    write("ctrl", "update-broadcast", bytes([0]) + records(
        1, [(r, update([request("b", kind=1, root=2, dtype=3)]))
            for r in range(3)]))
    write("ctrl", "update-join", bytes([0]) + records(
        2, [(0, update([request("hvd.join", kind=4)])),
            (1, update([request("x", op=1, counts=(3, 4, 5))])),
            (2, update([request("x", op=1, counts=(3, 4, 5))])),
            (3, update([request("hvd.join", kind=4)], stop=True))]))
    write("ctrl", "update-stall", bytes([0]) + records(
        0x82, [(1, update([request("late", age=9.0)], ready=(1, 2),
                          invalidate=(3,), seen=7))]))
    write("ctrl", "update-barrier-gather", bytes([0]) + records(
        0, [(0, update([request("bar", kind=3), request("g", kind=2)])),
            (1, update([request("bar", kind=3), request("g", kind=2)]))]))
    r = response("grad.a", contributors=4)
    write("ctrl", "cycle", bytes([1]) + cycle(1, run=(0, 2), erase=(1,),
                                              responses=[r]))
    write("ctrl", "cycle-error", bytes([1]) + cycle(
        2, responses=[response("m", status=3, error="ranks disagree",
                               contributors=0)]))
    write("ctrl", "cycle-joined", bytes([1]) + cycle(
        3, responses=[response("j", op=1, contributors=3, joined=(2,),
                               last_joined=2)], paused=True, stop=True))
    write("ctrl", "contribute", bytes([2]) + field_varint(1, 1) +
          field_bytes(2, b"host\0" + bytes(60)))
    write("ctrl", "result", bytes([3]) + field_varint(1, 0) +
          field_bytes(2, b"a" * 8) + field_bytes(2, b"b" * 8))
    write("ctrl", "response-list", bytes([4]) + field_bytes(1, r))
    write("ctrl", "brief-step", bytes([5]) + struct.pack("<QII", 12, 3, 1) +
          struct.pack("<IIII", 0, 4, 7, 4))


# ---- frames ----

def frame(ftype, seq, msg_len, length):
    return struct.pack("<HBBIQQ", 0x4856, ftype, 0, seq, msg_len, length)


DATA, BYE, ABORT, HEARTBEAT = 1, 2, 3, 4


def chunk(sock, b):
    return bytes([sock]) + struct.pack("<H", len(b)) + b


def frames():
    payload = bytes(range(100))
    one = frame(DATA, 0, 100, 100) + payload
    write("frame", "data", bytes([0x00]) + struct.pack("<H", 100) +
          chunk(0, one))
    write("frame", "data-bye-eof", bytes([0x04]) + struct.pack("<H", 100) +
          chunk(0, one + frame(BYE, 1, 0, 0)))
    write("frame", "heartbeat-data", bytes([0x00]) + struct.pack("<H", 100) +
          chunk(0, frame(HEARTBEAT, 0, 0, 0) + frame(DATA, 1, 100, 100) +
                payload))
    text = b"lost rank 1 (pid 42 on node7): its connection closed"
    abort = struct.pack("<III", 4, 1, 1) + text
    write("frame", "abort", bytes([0x00]) + struct.pack("<H", 100) +
          chunk(0, frame(ABORT, 0, 0, len(abort)) + abort))
    # 200 bytes striped over 2 sockets: parts of 64 and 136 bytes.
    p = bytes(200)
    write("frame", "striped", bytes([0x01]) + struct.pack("<H", 200) +
          chunk(0, frame(DATA, 0, 200, 64) + p[:64]) +
          chunk(1, frame(DATA, 0, 200, 136) + p[64:]))
    # The control channel is the socket after the data ones.
    write("frame", "control", bytes([0x40]) + struct.pack("<H", 100) +
          chunk(0, one) + chunk(1, frame(DATA, 0, 16, 16) + bytes(16)))
    write("frame", "mismatch", bytes([0x00]) + struct.pack("<H", 100) +
          chunk(0, frame(DATA, 0, 50, 50) + bytes(50)))
    write("frame", "send-and-eof", bytes([0x0C]) + struct.pack("<H", 100) +
          chunk(0, one[:60]))
    four = b"".join(frame(DATA, i, 10, 10) + bytes([i]) * 10 for i in range(4))
    write("frame", "four", bytes([0x30]) + struct.pack("<HHHH", 10, 10, 10, 10)
          + chunk(0, four))
    write("frame", "huge-length", bytes([0x00]) + struct.pack("<H", 100) +
          chunk(0, frame(DATA, 0, 1 << 62, 1 << 62)))
    write("frame", "bad-seq", bytes([0x04]) + struct.pack("<H", 100) +
          chunk(0, frame(DATA, 5, 100, 100) + payload))
    # HVD_TCP_PROTECT=integrity (byte 0 bit 7): a chunk whose socket byte
    # has bit 7 set is a frame in the clear that the harness seals as the
    # peer would; other chunks go as they are (forged).
    SEAL = 0x80
    write("frame", "integrity-data", bytes([0x80]) + struct.pack("<H", 100) +
          chunk(SEAL | 0, one))
    write("frame", "integrity-heartbeat-data-bye", bytes([0x84]) +
          struct.pack("<H", 100) + chunk(SEAL | 0, frame(HEARTBEAT, 0, 0, 0)) +
          chunk(SEAL | 0, frame(DATA, 1, 100, 100) + payload) +
          chunk(SEAL | 0, frame(BYE, 2, 0, 0)))
    big = bytes(i * 7 & 0xFF for i in range(5000))
    write("frame", "integrity-large", bytes([0x80]) + struct.pack("<H", 5000) +
          chunk(SEAL | 0, frame(DATA, 0, 5000, 5000) + big))
    write("frame", "integrity-large-cut", bytes([0x84]) +
          struct.pack("<H", 5000) +
          chunk(SEAL | 0, frame(DATA, 0, 5000, 5000) + big[:3000]))
    write("frame", "integrity-striped", bytes([0x81]) +
          struct.pack("<H", 200) +
          chunk(SEAL | 0, frame(DATA, 0, 200, 64) + p[:64]) +
          chunk(SEAL | 1, frame(DATA, 0, 200, 136) + p[64:]))
    write("frame", "integrity-abort", bytes([0x80]) + struct.pack("<H", 100) +
          chunk(SEAL | 0, frame(ABORT, 0, 0, len(abort)) + abort))
    write("frame", "integrity-control", bytes([0xC0]) +
          struct.pack("<H", 100) + chunk(SEAL | 0, one) +
          chunk(SEAL | 1, frame(DATA, 0, 16, 16) + bytes(16)))
    write("frame", "integrity-forged", bytes([0x80]) + struct.pack("<H", 100) +
          chunk(0, one + bytes(16)))
    write("frame", "integrity-seq-repeated", bytes([0x90]) +
          struct.pack("<HH", 10, 10) +
          chunk(SEAL | 0, frame(DATA, 0, 10, 10) + bytes(10)) +
          chunk(SEAL | 0, frame(DATA, 0, 10, 10) + bytes(10)))


# ---- handshake ----

MAGIC = 0x48564448
JOB = bytes([0x6a, 0x6f, 0x62, 0x2d, 0x69, 0x64, 0x2d, 0x66, 0x6f, 0x72,
             0x2d, 0x66, 0x75, 0x7a, 0x7a, 0x21])


NONE, INTEGRITY, ENCRYPT = 0, 1, 2


def hello(kind=2, rank=1, index=0, job=JOB, protect=NONE, version=2):
    """A HELLO: version 2 (68 bytes, the frame protection at offset 64);
    version=1 gives the old 64-byte one, refused for its version."""
    h = struct.pack("<IHH", MAGIC, version, kind) + job + \
        struct.pack("<II", rank, index) + bytes(range(32))
    if version >= 2:
        h += struct.pack("<HH", protect, 0)
    return h


def challenge(code=0, rank=0, protect=NONE):
    """A CHALLENGE (80 bytes): the server's frame protection at offset 12,
    its nonce at 16, its proof at 48 (the harness's assist fills it)."""
    return struct.pack("<IIIHH", MAGIC, code, rank, protect, 0) + \
        bytes(range(32)) + bytes(32)


def handshakes():
    resp = struct.pack("<II", MAGIC, 0) + bytes(32)
    result = struct.pack("<II", MAGIC, 0)
    # Byte 0: bit 0 client, bit 1 assist, bit 2 expect rank 0, bit 3 over
    # a socket, bit 4 this side protects frames with integrity.
    write("handshake", "server", bytes([0x00]) + hello() + resp)
    write("handshake", "server-assist", bytes([0x02]) + hello() + resp)
    write("handshake", "server-wrong-job", bytes([0x02]) +
          hello(job=bytes(16)) + resp)
    write("handshake", "server-rank-refused", bytes([0x02]) + hello(rank=9) +
          resp)
    write("handshake", "server-wrong-kind", bytes([0x02]) + hello(kind=1) +
          resp)
    write("handshake", "server-integrity", bytes([0x12]) +
          hello(protect=INTEGRITY) + resp)
    write("handshake", "server-encrypt", bytes([0x12]) +
          hello(protect=ENCRYPT) + resp)
    write("handshake", "server-protect-differs", bytes([0x02]) +
          hello(protect=INTEGRITY) + resp)
    write("handshake", "server-protect-unknown", bytes([0x02]) +
          hello(protect=7) + resp)
    # Version 1 (64-byte HELLO, no protection): refused for its version.
    write("handshake", "server-version1", bytes([0x02]) +
          hello(version=1) + resp)
    write("handshake", "socket-server-version1", bytes([0x08]) +
          hello(version=1))
    write("handshake", "client", bytes([0x01]) + challenge() + result)
    write("handshake", "client-assist", bytes([0x03]) + challenge() + result)
    write("handshake", "client-assist-rank0", bytes([0x07]) + challenge() +
          result)
    write("handshake", "client-integrity", bytes([0x13]) +
          challenge(protect=INTEGRITY) + result)
    write("handshake", "client-protect-differs", bytes([0x03]) +
          challenge(protect=ENCRYPT) + result)
    write("handshake", "client-protect-differs-result", bytes([0x13]) +
          challenge() + struct.pack("<II", MAGIC, 5))
    write("handshake", "client-refused", bytes([0x03]) + challenge(code=4))
    write("handshake", "client-result-refused", bytes([0x03]) + challenge() +
          struct.pack("<II", MAGIC, 4))
    write("handshake", "socket-server", bytes([0x08]) + hello() + resp)
    write("handshake", "socket-server-integrity", bytes([0x18]) +
          hello(protect=INTEGRITY) + resp)
    write("handshake", "socket-client", bytes([0x09]) + challenge() + result)
    write("handshake", "socket-half", bytes([0x08]) + hello()[:20])


# ---- configuration ----

def configs():
    write("config", "env-hvdrun", b"\x00" + b"\n".join([
        b"HVD_RANK=1", b"HVD_SIZE=4", b"HVD_LOCAL_RANK=1",
        b"HVD_LOCAL_SIZE=2", b"HVD_CROSS_RANK=0", b"HVD_CROSS_SIZE=2",
        b"HVD_RENDEZVOUS_ADDR=127.0.0.1", b"HVD_RENDEZVOUS_PORT=4711",
        b"HVD_SECRET=s3cret", b"HVD_JOB_ID=00112233445566778899aabbccddeeff",
        b"HVD_TIMEOUT_SECONDS=30", b"HVD_START_TIMEOUT_SECONDS=60",
        b"HVD_TCP_NSOCKS=2", b"HVD_TCP_STRIPE_MIN=256K",
        b"HVD_CHUNK_BYTES=512K", b"HVD_PIPELINE_DEPTH=4",
        b"HVD_ALGORITHM=ring", b"HVD_BCAST_ALGORITHM=tree",
        b"HVD_FUSION_THRESHOLD=64M", b"HVD_CACHE_CAPACITY=1024",
        b"HVD_STALL_CHECK_SECONDS=60", b"HVD_TRANSPORT=tcp",
        b"HVD_IFACE=eth0", b"HVD_TIMELINE=/tmp/t.json"]))
    write("config", "env-openmpi", b"\x00" + b"\n".join([
        b"OMPI_COMM_WORLD_RANK=3", b"OMPI_COMM_WORLD_SIZE=4",
        b"OMPI_COMM_WORLD_LOCAL_RANK=1", b"OMPI_COMM_WORLD_LOCAL_SIZE=2"]))
    write("config", "env-slurm", b"\x00" + b"\n".join([
        b"SLURM_PROCID=5", b"SLURM_NTASKS=8", b"SLURM_LOCALID=1"]))
    write("config", "env-pmi", b"\x00PMI_RANK=0\nPMI_SIZE=2")
    write("config", "env-bad", b"\x00" + b"\n".join([
        b"HVD_RANK=4", b"HVD_SIZE=4", b"HVD_TCP_NSOCKS=99",
        b"HVD_FUSION_THRESHOLD=12Q", b"HVD_TIMEOUT_SECONDS=-1",
        b"HVD_JOB_ID=xyz"]))
    # Found by the fuzzer: a cross rank beyond the job was accepted.
    write("config", "env-cross-rank", b"\x00HVD_RANK=1\nHVD_SIZE=4\n"
          b"HVD_CROSS_RANK=5\nHVD_LOCAL_RANK=1")
    write("config", "env-bytes", b"\x00HVD_CHUNK_BYTES=17179869184G\n"
          b"HVD_RD_MAX_BYTES=1kb\nHVD_TREE_MAX_BYTES=0")
    write("config", "hostfile", b"\x01# cluster\nnode1 slots=4\n"
          b"node2:2 # two\n[fe80::1]:3\nnode1\n")
    write("config", "hostfile-bad", b"\x01node1 slots=0\nnode2 foo\n")
    write("config", "hostlist", b"\x02a:2,b,[::1]:3,fe80::2,a:1")
    write("config", "hostlist-bad", b"\x02a:0,,-b")


if __name__ == "__main__":
    ctrl()
    frames()
    handshakes()
    configs()
