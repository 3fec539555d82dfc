#!/usr/bin/env python3
"""The Grafana dashboard as shipped (deploy/grafana/rankscope.json): a
well-formed dashboard (unique panel ids, panels inside the 24-column grid and
not overlapping, every query on the dashboard's Prometheus variable), every
query valid PromQL (promtool check rules parses each as a recording rule,
Grafana's interval variables put to a value), and every metric a query reads
one the collector exports (docs/metrics.md's catalogue, which alert.Metrics.*
holds to the code and to a real scrape).

  tests/deploy/verify_dashboard.py
  tests/deploy/verify_dashboard.py --prometheus URL

With --prometheus, every query is also evaluated by that (live) Prometheus
scraping a collector: each must be valid and return data (the collector
exports every series from its start, at zero where nothing happened).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PROMTOOL = os.environ.get("PROMTOOL", "/usr/bin/promtool")
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def catalogue():
    with open(os.path.join(SRC, "docs", "metrics.md")) as f:
        names = set(re.findall(r"^\| `(rankscope_[a-z_]+)`", f.read(), re.M))
    if not names:
        fail("no metric catalogue found in docs/metrics.md")
    return names


def evaluate_live(prometheus, queries):
    """Each query against a live Prometheus: valid, and with data."""
    for title, expr in queries:
        body = urllib.parse.urlencode({"query": expr}).encode()
        try:
            with urllib.request.urlopen(prometheus + "/api/v1/query", body, timeout=10) as response:
                reply = json.load(response)
        except urllib.error.HTTPError as e:
            fail("Prometheus refuses panel %r's query %s: %s" % (title, expr, e.read().decode(errors="replace")))
        except OSError as e:
            fail("Prometheus at %s does not answer: %s" % (prometheus, e))
        if reply.get("status") != "success":
            fail("panel %r's query %s failed: %r" % (title, expr, reply))
        result = reply["data"]["result"]
        if not result:
            fail("panel %r's query returned nothing during a live job: %s" % (title, expr))
        print("data: %s: %s (%d series)" % (title, expr, len(result)))
    print("live: every one of the %d queries returned data" % len(queries))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--prometheus", help="evaluate every query against this Prometheus too")
    args = parser.parse_args()
    with open(os.path.join(SRC, "deploy", "grafana", "rankscope.json")) as f:
        dashboard = json.load(f)
    variables = [v["name"] for v in dashboard.get("templating", {}).get("list", [])]
    if "datasource" not in variables:
        fail("the dashboard has no datasource variable")
    panels = dashboard.get("panels", [])
    ids, cells, queries = set(), {}, []
    for p in panels:
        if p["id"] in ids:
            fail("panel id %d is used twice" % p["id"])
        ids.add(p["id"])
        g = p["gridPos"]
        if g["x"] < 0 or g["w"] <= 0 or g["x"] + g["w"] > 24 or g["h"] <= 0:
            fail("panel %r lies outside the 24-column grid: %r" % (p["title"], g))
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                if (x, y) in cells:
                    fail("panels %r and %r overlap" % (cells[(x, y)], p["title"]))
                cells[(x, y)] = p["title"]
        if p["type"] == "row":
            continue
        if not p.get("targets"):
            fail("panel %r has no query" % p["title"])
        for t in p["targets"]:
            if t.get("datasource", {}).get("uid") != "${datasource}":
                fail("panel %r queries another datasource than ${datasource}" % p["title"])
            queries.append((p["title"], t["expr"]))

    known = catalogue()
    rules = {"groups": [{"name": "dashboard", "rules": []}]}
    for i, (title, expr) in enumerate(queries):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        if "$" in expr:
            fail("panel %r uses a variable this check does not know: %s" % (title, expr))
        rules["groups"][0]["rules"].append({"record": "dashboard:query_%d" % i, "expr": expr})
        for metric in re.findall(r"(?<![:\w])(rankscope_[a-z_]+)", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", metric)
            if metric not in known and base not in known:
                fail("panel %r reads %s, which the collector does not export" % (title, metric))
    if not os.access(PROMTOOL, os.X_OK):
        fail(PROMTOOL + " is missing: scripts/install-deps.sh test installs Debian's prometheus")
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        json.dump(rules, f)  # JSON is YAML
        path = f.name
    try:
        check = subprocess.run([PROMTOOL, "check", "rules", path], capture_output=True, text=True)
    finally:
        os.unlink(path)
    if check.returncode != 0:
        fail("promtool refuses a query:\n" + check.stdout + check.stderr)
    print("dashboard verified: %d panels, %d queries" % (len(panels), len(queries)))
    if args.prometheus:
        live = []
        for title, expr in queries:
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            live.append((title, expr))
        evaluate_live(args.prometheus.rstrip("/"), live)


main()
