#!/bin/bash
# lb-background.sh MODE BIN...: the CPU the agent (and the nft processes it runs) spends at
# 5,000 load-balanced services (datapath none, rr, 2 backends each) in a network namespace of
# its own, measured from /proc (user + system, the agent and its waited-for children), the
# builds given run one after another. MODE:
#   idle    90 s without a change (the periodic full read, Settle)
#   toggle  40 API changes in ~60 s: a backend of a service drained, undone 1.5 s later
#   drains  40 API drains in ~60 s, each of another service
#   burst   the config rewritten 3 times 20 s apart, every service's backends 2 -> 3 -> 2 -> 3
#           (every service chain rewritten at once)
# Root; no traffic is sent. docs/benchmarks/2026-11-27-a6a2ccc-lb-background.md has results.
set -euo pipefail
mode=$1; shift
work=$(mktemp -d /tmp/lb-background.XXXXXX)
trap 'rm -rf "$work"' EXIT
config() { # config BACKENDS (2 or 3 per service)
  awk -v w="$work" -v n="$1" 'BEGIN {
    printf "datapath: none\nloadBalancer:\n  api: {socket: %s/lb.sock}\n  stateFile: %s/state.yaml\n  services:\n", w, w
    for (i = 0; i < 5000; i++) {
      a = int(i / 250); b = i % 250 + 1
      third = n > 2 ? sprintf(", {address: 10.3.%d.%d, port: 8080}", a, b) : ""
      printf "  - {name: s%d, vips: [10.96.%d.%d], port: 80, topology: dnat, scheduler: rr, backends: [{address: 10.1.%d.%d, port: 8080}, {address: 10.2.%d.%d, port: 8080}%s]}\n", i, a, b, a, b, a, b, third
    }
  }' > "$work/config.yaml.new" && mv "$work/config.yaml.new" "$work/config.yaml"
}
config 2
cpu() { awk -v t="$(getconf CLK_TCK)" '{printf "%.2f %.2f", ($14+$15)/t, ($16+$17)/t}' "/proc/$1/stat"; }
backend() { local s=$1; echo "10.1.$((s / 250)).$((s % 250 + 1)):8080"; }
for bin in "$@"; do
  ns=lbbg$$; rm -f "$work/state.yaml"; config 2
  ip netns add "$ns"; ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" "$bin" agent -f "$work/config.yaml" > "$work/agent.log" 2>&1 &
  pid=$!
  for _ in $(seq 180); do grep -q "load balancer applied" "$work/agent.log" && break; sleep 1; done
  sleep 5
  read -r s0 c0 <<<"$(cpu $pid)"; t0=$(date +%s.%N)
  case $mode in
  idle) sleep 90 ;;
  toggle|drains)
    for i in $(seq 40); do
      s=$((i * 97 % 5000))
      if [[ $mode == drains ]] || (( i % 2 )); then
        "$bin" lb --socket "$work/lb.sock" backend drain "s$s" "$(backend $s)" > /dev/null
      else
        p=$(((i - 1) * 97 % 5000))
        "$bin" lb --socket "$work/lb.sock" backend set "s$p" "$(backend $p)" --state up > /dev/null
      fi
      sleep 1.5
    done ;;
  burst) for n in 3 2 3; do config $n; sleep 20; done ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
  read -r s1 c1 <<<"$(cpu $pid)"; t1=$(date +%s.%N)
  awk -v m="$mode" -v b="$bin" -v dt="$(awk "BEGIN{print $t1 - $t0}")" \
    -v s="$(awk "BEGIN{print $s1 - $s0}")" -v c="$(awk "BEGIN{print $c1 - $c0}")" \
    'BEGIN { printf "%s %s: %.0f s, agent %.2f s of CPU, its nft processes %.2f s\n", m, b, dt, s, c }'
  kill $pid; wait $pid 2>/dev/null || true
  ip netns del "$ns"
done
