#!/bin/bash
# nginx's compose health check: GET /nginx-health answers 200. The nginx images
# (official and local) have bash but not necessarily curl, hence /dev/tcp.
set -eu
port="${1:-8471}"
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf 'GET /nginx-health HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
read -r -t 2 status_line <&3
[[ "$status_line" == *" 200 "* ]]
