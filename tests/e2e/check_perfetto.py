#!/usr/bin/env python3
"""Checks a `rankscope export --format perfetto` trace (tests/e2e/usage_test.cpp).

It must parse as JSON (Chrome Trace Event format), name one track per rank
grouped by node, hold each rank's collectives in sequence order, and put the
ranks of different nodes on one timeline: the same collective (communicator,
sequence number) issued on every node within --max-skew-ms (median).
Prints what it found; exits 1 with the reason when a check fails.
"""
import argparse
import json
import statistics
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("trace")
    parser.add_argument("--tracks", type=int, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--min-slices", type=int, default=1)
    parser.add_argument("--max-skew-ms", type=float, required=True)
    args = parser.parse_args()
    with open(args.trace) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    nodes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name" and e["pid"] != 0}
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    slices = [e for e in events if e.get("ph") == "X"]
    failures = []
    if len(nodes) != args.nodes:
        failures.append("%d node groups, expected %d: %s" % (len(nodes), args.nodes, nodes))
    if len(tracks) != args.tracks:
        failures.append("%d tracks, expected %d: %s" % (len(tracks), args.tracks, tracks))
    by_track = {}
    for e in slices:
        by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    for key, name in sorted(tracks.items()):
        mine = sorted(by_track.get(key, []), key=lambda e: e["ts"])
        if len(mine) < args.min_slices:
            failures.append("track %s (%s) has %d slices, expected at least %d" % (key, name, len(mine), args.min_slices))
        last = {}
        for e in mine:
            lane = (e["args"]["comm"], e["args"]["lane"])
            if lane in last and e["args"]["seq"] <= last[lane]:
                failures.append("track %s: seq %d after %d in time order" % (name, e["args"]["seq"], last[lane]))
                break
            last[lane] = e["args"]["seq"]
        print("track %-24s node %-10s %5d slices" % (name, nodes.get(key[0], "?"), len(mine)))
    # The same collective on each node: mean issue time per node, then the spread.
    issue = {}
    for e in slices:
        issue.setdefault((e["args"]["comm"], e["args"]["lane"], e["args"]["seq"]), {}).setdefault(e["pid"], []).append(e["ts"])
    spreads = []
    for per_node in issue.values():
        if len(per_node) == args.nodes:
            means = [sum(v) / len(v) for v in per_node.values()]
            spreads.append((max(means) - min(means)) / 1000.0)
    if not spreads:
        failures.append("no collective seen on every node")
    else:
        median = statistics.median(spreads)
        print("collectives on every node: %d; spread across nodes: median %.3f ms, max %.3f ms" % (len(spreads), median, max(spreads)))
        if median > args.max_skew_ms:
            failures.append("nodes are %.3f ms apart (median), more than %.1f ms" % (median, args.max_skew_ms))
    instants = [e for e in events if e.get("ph") == "i"]
    print("findings as instant events: %d" % len(instants))
    for failure in failures:
        print("FAIL: " + failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
