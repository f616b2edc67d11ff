# The seconds budget of a one-call device script, sourced after DEADLINE is set (the seconds
# from the source to the last part's end): `now` the seconds since then, `el MSG` MSG with that
# time, `room N WHAT` true when N seconds are left, else it says WHAT is skipped.
T0=$(date +%s)
now() { echo $(( $(date +%s) - T0 )); }
el() { echo "[t=$(now)s] $*"; }
room() { [ $(( DEADLINE - $(now) )) -ge "$1" ] || { el "skipped: $2"; return 1; }; }
