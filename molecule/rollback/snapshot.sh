#!/bin/sh
# Usage: snapshot.sh OUT. Hashes every regular file of /etc and /usr/local and
# lists every symlink with its target (unit masks and enables) into OUT.
set -e
{
  find /etc /usr/local -xdev -type f -print0 | sort -z | xargs -0 sha256sum
  find /etc /usr/local -xdev -type l -printf '%p -> %l\n' | sort
} > "$1"
