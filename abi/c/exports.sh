#!/bin/sh
# Records the dynamic symbols a libibverbs.so.1 defines, one "VERSION NAME"
# per line; a compat (non-default) version is written "(VERSION) NAME", as
# objdump -T shows it. Run on the distribution's library to refresh
# libibverbs_exports.txt:  sh abi/c/exports.sh > abi/c/libibverbs_exports.txt
set -e
lib=${1:-/usr/lib/x86_64-linux-gnu/libibverbs.so.1}
objdump -T "$lib" | awk '$2 == "g" && $0 !~ /\*UND\*/ { print $(NF-1), $NF }' | LC_ALL=C sort -k2,2 -k1,1
