#!/bin/bash
# Prints the SASS of the functions of BINARY whose mangled names contain KEY (all of them),
# for diffing two builds of one kernel:  bench/sass_extract.sh BINARY KEY > out.sass
cuobjdump --dump-sass "$1" | awk -v key="$2" '/Function :/ {keep = index($0, key) > 0} keep'
