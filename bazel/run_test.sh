#!/bin/sh
# sh_test entry for tests that are one command (CMake's add_test(NAME x COMMAND ...)): runs
# its arguments from the runfiles directory and passes on the exit status. Arguments naming
# files in the runfiles become absolute paths, as CMake passes them.
set -eu
[ $# -gt 0 ] || { echo "usage: run_test.sh COMMAND [ARG...]" >&2; exit 2; }
for arg in "$@"; do
  shift
  case "$arg" in
    /* | -*) ;;
    *) [ -e "$arg" ] && arg="$PWD/$arg" ;;
  esac
  set -- "$@" "$arg"
done
exec "$@"
