#!/usr/bin/env bash
# Manual LAN/WAN emulation for the three MPC parties (root required).
#
# NOTE: net/peer/emulate.py is the supported path (python -m net.peer.emulate check
# --net lan|wan|custom:R:RTT, and the Emulation API used by benchmarks).  This
# script is a small equivalent for poking at things by hand; it uses the same
# layout: namespaces mpc3-sh-p{0,1,2}, a veth mesh, party i = 10.77.0.<i+1>.
#
#   deploy/netns.sh up [lan|wan|RATE_MBIT RTT_MS] [PORTS...]   (default ports 47000-47002)
#   deploy/netns.sh down
#   ip netns exec mpc3-sh-p0 <cmd>        # run a party
#
# With sch_netem: netem (delay RTT/2 + rate) on every veth end; dial 10.77.0.<j+1>:PORT.
# Without it:     tbf rate + the delay relay of net/peer/emulate.py inside each
#                 namespace; party i dials 127.0.1.<j+1>:PORT to reach party j.
set -euo pipefail
NS=mpc3-sh
HERE=$(cd "$(dirname "$0")/.." && pwd)
PIDS=/run/$NS.pids

down() {
  [ -f "$PIDS" ] && xargs -r kill 2>/dev/null <"$PIDS" || true
  rm -f "$PIDS"
  for i in 0 1 2; do
    for p in $(ip netns pids $NS-p$i 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del $NS-p$i 2>/dev/null || true
  done
}

up() {
  case "${1:-lan}" in
    lan) RATE=4930; RTT=1.17; shift || true ;;
    wan) RATE=97.4; RTT=141.67; shift ;;
    *)   RATE=$1; RTT=$2; shift 2 ;;
  esac
  PORTS=("${@:-47000 47001 47002}"); PORTS=(${PORTS[*]})
  down
  for i in 0 1 2; do ip netns add $NS-p$i; ip -n $NS-p$i link set lo up; done
  RATE_TC=$(awk "BEGIN{print $RATE*1514/1448}")          # goodput -> wire rate
  ONEWAY=$(awk "BEGIN{print $RTT/2}")
  BURST=$(awk "BEGIN{b=$RATE_TC*125; print (b>65536?int(b):65536)}")
  ip netns add $NS-probe; NETEM=0
  ip netns exec $NS-probe tc qdisc add dev lo root netem delay 1ms 2>/dev/null && NETEM=1
  ip netns del $NS-probe
  for pair in "0 1" "0 2" "1 2"; do
    set -- $pair; a=$1; b=$2
    ip -n $NS-p$a link add to$b type veth peer name to$a netns $NS-p$b
    for end in "$a $b" "$b $a"; do
      set -- $end; me=$1; other=$2
      ip -n $NS-p$me addr add 10.77.0.$((me+1)) peer 10.77.0.$((other+1)) dev to$other
      ip -n $NS-p$me link set to$other up
      if [ $NETEM = 1 ]; then
        ip netns exec $NS-p$me tc qdisc add dev to$other root netem delay ${ONEWAY}ms rate ${RATE_TC}mbit limit 100000
      else
        ip netns exec $NS-p$me tc qdisc add dev to$other root tbf rate ${RATE_TC}mbit burst $BURST limit $((2*BURST+65536))
      fi
    done
  done
  if [ $NETEM = 0 ]; then                 # delay relays: party i -> party j
    for i in 0 1 2; do for j in 0 1 2; do [ $i = $j ] && continue
      for port in "${PORTS[@]}"; do
        MPC3_RELAY_DETACH=1 setsid ip netns exec $NS-p$i python3 "$HERE/net/emulate.py" _relay \
          "$ONEWAY" "$RATE" "127.0.1.$((j+1)):$port=10.77.0.$((j+1)):$port" \
          >/dev/null 2>&1 </dev/null & echo $! >>"$PIDS"
      done
    done; done
  fi
  echo "up: $RATE Mbit/s, $RTT ms RTT, $([ $NETEM = 1 ] && echo netem || echo tbf+relay); namespaces $NS-p0..2"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down; echo down ;;
  *) echo "usage: $0 up [lan|wan|RATE_MBIT RTT_MS] [PORTS...] | down" >&2; exit 2 ;;
esac
