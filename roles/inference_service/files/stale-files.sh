#!/bin/sh
# stale-files.sh UNIT: what the running service of UNIT was started from and has changed since its main process
# started, one path per line: its unit file, the folder of its program (a new engine is unpacked with the files' old
# times, into a new folder), and every other absolute path on its command line (the model). Prints nothing when none
# changed or the unit runs no process. A run interrupted between writing such a file and restarting the service
# leaves an engine running what it read before (systemctl(1) show: MainPID, ExecMainStartTimestampMonotonic,
# FragmentPath, ExecStart; proc(5): btime, the boot time in seconds since the epoch).
set -eu
unit=$1
pid=$(systemctl show --property MainPID --value "$unit")
started_us=$(systemctl show --property ExecMainStartTimestampMonotonic --value "$unit")
[ "${pid:-0}" -gt 0 ] && [ "${started_us:-0}" -gt 0 ] || exit 0
btime=$(awk '/^btime / {print $2}' /proc/stat)
# Whole seconds on both sides: only changes after the second the process started in count.
started=$((btime + started_us / 1000000 + 1))
fragment=$(systemctl show --property FragmentPath --value "$unit")
set --
[ -e "$fragment" ] && set -- "$fragment"
# ExecStart reads "{ path=PROGRAM ; argv[]=WORD WORD ... ; ignore_errors=no ; ... }".
command=$(systemctl show --property ExecStart --value "$unit")
program=$(printf '%s\n' "$command" | sed -n 's/^{ path=\([^ ;]*\) ;.*/\1/p')
[ -n "$program" ] && [ -e "$program" ] && set -- "$@" "$(dirname "$program")"
for word in $(printf '%s\n' "$command" | sed -n 's/.*argv\[\]=[^ ;]* \([^;]*\);.*/\1/p'); do
  case $word in
    /*) [ -e "$word" ] && set -- "$@" "$word" ;;
  esac
done
[ $# -gt 0 ] || exit 0
find "$@" -maxdepth 0 -newermt "@$started" -print | sort -u
