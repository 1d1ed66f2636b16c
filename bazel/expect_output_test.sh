#!/bin/sh
# sh_test entry for CTest's PASS_REGULAR_EXPRESSION: passes when the output of
# COMMAND [ARG...] matches REGEX (extended), whatever its exit status.
# Usage: expect_output_test.sh REGEX COMMAND [ARG...]
set -u
regex=$1
shift
out=$("$@" 2>&1)
echo "$out"
echo "$out" | grep -Eq -- "$regex" || { echo "output does not match: $regex" >&2; exit 1; }
