#!/bin/sh
# rdmacm_map.sh EXPORTS OUT: writes the version script of librdmacm.so.1
# from its export table: one node per RDMACM_1.x, each inheriting the one
# before, as the distribution's library has them. rdmacm.c defines every
# name (the build fails on one it lacks: -Wl,--no-undefined-version).
set -e
awk '$1 != $2 { if (!($1 in seen)) { seen[$1] = 1; order[n++] = $1 }; names[$1] = names[$1] "\t\t" $2 ";\n" }
END {
	for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) {
		split(order[i], a, "."); split(order[j], b, ".")
		if (a[2] + 0 > b[2] + 0) { t = order[i]; order[i] = order[j]; order[j] = t }
	}
	prev = ""
	for (i = 0; i < n; i++) {
		printf "%s {\n\tglobal:\n%s", order[i], names[order[i]]
		if (i == 0) printf "\tlocal: *;\n"
		printf "}%s;\n\n", prev == "" ? "" : " " prev
		prev = order[i]
	}
}' "$1" > "$2"
