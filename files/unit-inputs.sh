#!/bin/sh
# unit-inputs.sh MODE UNIT [FILE...]: what the running service of systemd unit UNIT was started from - its unit file,
# its drop-ins (a template unit's instance settings), the folder of its program (a new engine is unpacked with the
# files' old times, into a new folder) and every other absolute path on its command line (the model) - from
# systemctl(1) show (MainPID, ExecMainStartTimestampMonotonic, FragmentPath, DropInPaths, ExecStart).
#   stale        those (or, when given, each FILE) changed since its main process started, one per line; nothing
#                when none did or no process runs. A run interrupted between writing such a file and restarting the
#                service leaves that behind.
#   reloaded     each FILE changed since the service last loaded its configuration, one per line: for a server
#                that reloads by starting new worker processes (nginx(8): on SIGHUP the master starts new workers
#                with the new configuration and old ones shut down gracefully), the start of its oldest worker that
#                is not on its way out (the main process's when it has none). A run interrupted between writing
#                such a file and the reload leaves that behind.
#   fingerprint  a sha256 of their content (the unit file) and of the name, size and time of every file under them,
#                with the boot (proc(5) boot_id), the kernel command line and each FILE (e.g. the tuning state):
#                what a measurement of the service depends on.
set -eu
mode=$1
unit=$2
shift 2
started_us=$(systemctl show --property ExecMainStartTimestampMonotonic --value "$unit")
pid=$(systemctl show --property MainPID --value "$unit")
fragment=$(systemctl show --property FragmentPath --value "$unit")
dropins=$(systemctl show --property DropInPaths --value "$unit")
command=$(systemctl show --property ExecStart --value "$unit")
# ExecStart reads "{ path=PROGRAM ; argv[]=PROGRAM WORD ... ; ignore_errors=no ; ... }".
program=$(printf '%s\n' "$command" | sed -n 's/^{ path=\([^ ;]*\) ;.*/\1/p')
inputs=
[ -n "$fragment" ] && [ -e "$fragment" ] && inputs=$fragment
for dropin in $dropins; do
  [ -e "$dropin" ] && inputs="$inputs $dropin"
done
[ -n "$program" ] && [ -e "$program" ] && inputs="$inputs $(dirname "$program")"
for word in $(printf '%s\n' "$command" | sed -n 's/.*argv\[\]=[^ ;]* \([^;]*\);.*/\1/p'); do
  case $word in
    /*) [ -e "$word" ] && inputs="$inputs $word" ;;
  esac
done
case $mode in
  stale)
    [ $# -eq 0 ] || inputs="$*"
    [ "${pid:-0}" -gt 0 ] && [ "${started_us:-0}" -gt 0 ] && [ -n "$inputs" ] || exit 0
    # proc(5) btime: the boot in seconds since the epoch. Whole seconds on both sides: only changes after the second
    # the process started in count.
    btime=$(awk '/^btime / {print $2}' /proc/stat)
    # shellcheck disable=SC2086 # paths without blanks, one word each
    find $inputs -maxdepth 0 -newermt "@$((btime + started_us / 1000000 + 1))" -print | sort -u ;;
  reloaded)
    [ "${pid:-0}" -gt 0 ] && [ $# -gt 0 ] || exit 0
    # ps(1) etimes: seconds since each process started. Workers on their way out still run the configuration before
    # and may outlive a long stream: nginx(8) titles them "shutting down", haproxy(1) names them after -sf in the
    # arguments of the worker that replaced them.
    workers=$(ps -o pid= -o etimes= -o args= --ppid "$pid" || true)
    leaving=" $(printf '%s\n' "$workers" | grep -o -- ' -sf [0-9 ]*' | sed 's/^ -sf //' | tr '\n' ' ') "
    age=$(printf '%s\n' "$workers" | grep -v 'shutting down' |
      awk -v leaving="$leaving" 'NF && index(leaving, " " $1 " ") == 0 && $2 > max {max = $2} END {print max + 0}')
    [ "$age" -gt 0 ] || age=$(ps -o etimes= -p "$pid")
    existing=
    for file in "$@"; do
      [ -e "$file" ] && existing="$existing $file"
    done
    [ -n "$existing" ] || exit 0
    # shellcheck disable=SC2086 # paths without blanks, one word each
    find $existing -maxdepth 0 -newermt "@$(($(date +%s) - age + 1))" -print | sort -u ;;
  fingerprint)
    {
      cat /proc/sys/kernel/random/boot_id /proc/cmdline
      [ -n "$fragment" ] && [ -e "$fragment" ] && cat "$fragment"
      # shellcheck disable=SC2086
      [ -z "$inputs" ] || find $inputs -printf '%p %s %T@\n' | sort
      for file in "$@"; do
        [ -e "$file" ] && { echo "$file"; cat "$file"; }
      done
    } | sha256sum | cut -d' ' -f1 ;;
  *) echo "usage: $0 stale|reloaded|fingerprint UNIT [FILE...]" >&2; exit 2 ;;
esac
