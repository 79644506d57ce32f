#!/bin/sh
# once.sh OUTPUT COMMAND [ARG...]: make OUTPUT once on this controller, safe against concurrent and interrupted runs.
# COMMAND writes "$ONCE_PART" (file or folder); it becomes OUTPUT by rename only after COMMAND succeeded, so a run
# killed half-way leaves no OUTPUT that a later `creates:` would trust. A second run waits on OUTPUT.lock (flock(1))
# and then finds OUTPUT made. Exit status: COMMAND's; 0 without running it when OUTPUT exists.
set -eu
out=$1
shift
exec 9>"$out.lock"
flock 9
[ -e "$out" ] && exit 0
ONCE_PART=$out.part
export ONCE_PART
rm -rf "$ONCE_PART"
"$@"
mv "$ONCE_PART" "$out"
