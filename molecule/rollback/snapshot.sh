set -e
find /etc /usr/local -xdev -type f -print0 | sort -z | xargs -0 sha256sum
find /etc /usr/local -xdev -type l -printf '%p -> %l\n' | sort
