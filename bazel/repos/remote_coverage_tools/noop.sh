#!/bin/sh
# No coverage tooling offline: do nothing, successfully.
exit 0
