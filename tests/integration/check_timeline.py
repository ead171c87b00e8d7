#!/usr/bin/env python3
"""Checks a timeline written by `test_engine timeline` (HVD_TIMELINE).

    check_timeline.py PATH

The file must be a Chrome trace: a JSON array of events. Checked:
- every event name the engine promises appears (NEGOTIATE_ALLREDUCE,
  QUEUE, the fusion-buffer copies, ALLREDUCE, BROADCAST, ALLGATHER);
- per (pid, tid), every "B" is closed by an "E", in order (a stack), and
  "ts" never decreases;
- ALLREDUCE, BROADCAST and ALLGATHER begin events carry "transport" and
  "algorithm" in their args;
- the process_name metadata names the test's tensors.
Prints what it found. Exit status: 0 pass, 1 fail, 2 bad usage.
"""
import json
import sys

REQUIRED_EVENTS = [
    "NEGOTIATE_ALLREDUCE",
    "QUEUE",
    "MEMCPY_IN_FUSION_BUFFER",
    "ALLREDUCE",
    "MEMCPY_OUT_FUSION_BUFFER",
    "BROADCAST",
    "ALLGATHER",
]
COLLECTIVES = ["ALLREDUCE", "BROADCAST", "ALLGATHER"]
# The names test_engine's timeline subtest submits (rank 0 writes the file
# and submits every one of them).
REQUIRED_TENSORS = ["tl.%d" % i for i in range(20)] + [
    "tl.bcast",
    "tl.gather",
    "tl.group",
]


def check(events):
    """Returns a list of problems (empty if the timeline is good)."""
    problems = []
    names = {}  # event name -> number of "B" events
    stacks = {}  # (pid, tid) -> names of the open "B" events
    last_ts = {}  # (pid, tid) -> last ts seen
    tensors = set()

    for k, ev in enumerate(events):
        if not isinstance(ev, dict):
            problems.append("event %d is not an object: %r" % (k, ev))
            continue
        ph = ev.get("ph")
        if ph == "M":
            if ev.get("name") == "process_name":
                args = ev.get("args")
                if isinstance(args, dict) and "name" in args:
                    tensors.add(args["name"])
                else:
                    problems.append("event %d: process_name without "
                                    "args.name: %r" % (k, ev))
            continue
        if ph not in ("B", "E"):
            continue
        if "pid" not in ev or not isinstance(ev.get("ts"), (int, float)):
            problems.append("event %d: a %s event needs pid and a numeric "
                            "ts: %r" % (k, ph, ev))
            continue
        key = (ev["pid"], ev.get("tid", 0))
        ts = ev["ts"]
        if key in last_ts and ts < last_ts[key]:
            problems.append("event %d: ts %s goes back from %s on pid %s "
                            "tid %s" % (k, ts, last_ts[key], key[0], key[1]))
        last_ts[key] = ts
        stack = stacks.setdefault(key, [])
        if ph == "B":
            name = ev.get("name")
            if not isinstance(name, str):
                problems.append("event %d: a B event without a name: %r" %
                                (k, ev))
                name = "?"
            names[name] = names.get(name, 0) + 1
            stack.append(name)
            if name in COLLECTIVES:
                args = ev.get("args")
                if (not isinstance(args, dict) or "transport" not in args or
                        "algorithm" not in args):
                    problems.append("event %d: %s without transport and "
                                    "algorithm in args: %r" % (k, name, ev))
        else:
            if not stack:
                problems.append("event %d: E without an open B on pid %s "
                                "tid %s" % (k, key[0], key[1]))
                continue
            opened = stack.pop()
            # An E may repeat its B's name; if it does, they must agree.
            if "name" in ev and ev["name"] != opened:
                problems.append("event %d: E named %r closes B %r" %
                                (k, ev["name"], opened))

    for key, stack in sorted(stacks.items(), key=lambda kv: str(kv[0])):
        if stack:
            problems.append("pid %s tid %s: %d B events never ended: %s" %
                            (key[0], key[1], len(stack), stack))
    for name in REQUIRED_EVENTS:
        if name not in names:
            problems.append("no %s event" % name)
    missing = [t for t in REQUIRED_TENSORS if t not in tensors]
    if missing:
        problems.append("no process_name for tensors %s" % missing)

    print("check_timeline: %d events, %d tensors (pids), %d (pid, tid) "
          "tracks" % (len(events), len(tensors), len(stacks)))
    for name in sorted(names):
        print("check_timeline:   %-26s %d" % (name, names[name]))
    return problems


def main(argv):
    if len(argv) != 2:
        print("usage: %s PATH" % argv[0], file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8") as f:
            events = json.load(f)
    except (OSError, ValueError) as e:
        print("check_timeline: FAIL: %s is not readable JSON: %s" %
              (argv[1], e))
        return 1
    if not isinstance(events, list):
        print("check_timeline: FAIL: %s is a JSON %s, not an array of events" %
              (argv[1], type(events).__name__))
        return 1
    problems = check(events)
    for p in problems[:50]:
        print("check_timeline: FAIL: %s" % p)
    if len(problems) > 50:
        print("check_timeline: ... and %d more problems" % (len(problems) - 50))
    if problems:
        return 1
    print("check_timeline: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
