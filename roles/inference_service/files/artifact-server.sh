#!/bin/sh
# artifact-server.sh FOLDER ADDRESS PORT LIFETIME_S: serve FOLDER over HTTP with Python's http.server at ADDRESS:PORT,
# in the background for at most LIFETIME_S seconds (a run that stops half-way leaves no server behind for long),
# unless the server this script started for FOLDER still runs. Prints "started" or "running".
set -eu
folder=$1
address=$2
port=$3
lifetime=$4
# Beside the folder, not in it: the server would serve them.
pidfile=$folder.server.pid
if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  echo running
  exit 0
fi
mkdir -p "$folder"
setsid timeout "$lifetime" python3 -m http.server --bind "$address" --directory "$folder" "$port" \
  >"$folder.server.log" 2>&1 </dev/null &
echo $! >"$pidfile"
echo started
