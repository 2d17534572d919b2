#!/bin/bash
# nginx's compose health check: GET /nginx-health answers 200. The nginx images
# (official and local) have bash but not necessarily curl, hence /dev/tcp.
# The other edge proxies' images run it too, with their own path as $2
# (streamlab/lab/compose_config.py's HEALTH_PATHS).
set -eu
port="${1:-8471}"
path="${2:-/nginx-health}"
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf 'GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n' "$path" >&3
read -r -t 2 status_line <&3
[[ "$status_line" == *" 200 "* ]]
