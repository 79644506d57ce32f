#!/bin/sh
# delete-nft-tables.sh REGEX: deletes every nftables table of the inet family whose whole name matches REGEX (a sed
# basic regular expression) and prints "deleted NAME" for each; does nothing where nft is not installed. The engine
# access rules (roles/inference_service/templates/engine-access.nft.j2) are such tables, named llmtune_<service>;
# `nft list tables inet` and `nft delete table inet NAME` are from nft(8), RULESET and TABLES.
set -eu
[ $# -eq 1 ] || { echo "usage: $0 REGEX" >&2; exit 2; }
command -v nft >/dev/null || exit 0
for table in $(nft list tables inet | sed -n "s/^table inet \($1\)\$/\1/p"); do
  nft delete table inet "$table"
  echo "deleted $table"
done
