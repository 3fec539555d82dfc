#!/usr/bin/env bash
# The Prometheus rules as shipped (deploy/prometheus/rankscope-rules.yml):
# valid for Prometheus (`promtool check rules`), their alerts and recording
# rules right on the series of tests/deploy/rankscope-rules.test.yml
# (`promtool test rules`), and every rankscope metric they read one the
# collector exports: in docs/metrics.md's catalogue, which
# alert.Metrics.* holds to the code and to a real scrape.
#   tests/deploy/verify_rules.sh
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
rules="$src/deploy/prometheus/rankscope-rules.yml"
promtool=${PROMTOOL:-/usr/bin/promtool}
[ -x "$promtool" ] || { echo "FAIL: $promtool is missing: scripts/install-deps.sh test installs Debian's prometheus"; exit 1; }
"$promtool" check rules "$rules"
(cd "$src/tests/deploy" && "$promtool" test rules rankscope-rules.test.yml)
catalogue=$(grep -o '^| `rankscope_[a-z_]*`' "$src/docs/metrics.md" | tr -d '|` ' | sort -u)
[ -n "$catalogue" ] || { echo "FAIL: no metric catalogue found in docs/metrics.md"; exit 1; }
used=$(grep -v '^ *#' "$rules" | grep -oP '(?<![:\w])rankscope_[a-z_]+' | sort -u)  # not recording rules' names (level:metric:op)
missing=$(comm -23 <(echo "$used") <(echo "$catalogue"))
if [ -n "$missing" ]; then
  echo "FAIL: the rules read metrics the collector does not export: $missing"
  exit 1
fi
echo "rules verified; metrics read: $(echo $used)"
