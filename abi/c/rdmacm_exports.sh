#!/bin/sh
# Records the dynamic symbols a librdmacm.so.1 defines (the format of
# exports.sh). Run on the distribution's library to refresh
# librdmacm_exports.txt:  sh abi/c/rdmacm_exports.sh > abi/c/librdmacm_exports.txt
exec sh "$(dirname "$0")/exports.sh" "${1:-/usr/lib/x86_64-linux-gnu/librdmacm.so.1}"
