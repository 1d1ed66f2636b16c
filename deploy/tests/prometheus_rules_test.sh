#!/usr/bin/env bash
# Checks deploy/prometheus/ with Debian's promtool: the scrape config and the rules parse,
# and the rules' unit tests (commd.rules.test.yml) pass.
# Usage: prometheus_rules_test.sh DEPLOY_PROMETHEUS_DIR
set -euo pipefail
cd "$1"
command -v promtool >/dev/null || { echo "promtool missing (package prometheus)"; exit 1; }
promtool check config prometheus.yml
promtool check rules commd.rules.yml
promtool test rules commd.rules.test.yml
