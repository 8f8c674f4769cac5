#!/bin/sh
# Serves public/ on this instance's address and port (given by flotilla's env).
set -eu
cd public
exec python3 -m http.server --bind "$WEB_HOST" "$WEB_PORT"
