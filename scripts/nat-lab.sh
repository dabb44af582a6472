#!/usr/bin/env bash
# A small internet in network namespaces, for tests of peer-to-peer paths
# (traffic never leaves them). "Public": P-pub, whose address 100.64.0.1 the
# coordinator and coturn listen on, routing between the NATs' WAN sides. Two
# homes, P-home1 (192.168.1.2) and P-home2 (192.168.2.2), each behind its own
# NAT namespace (P-nat1, P-nat2: nftables masquerade); no route joins the homes
# except through their NATs. P-sink swallows what the public side sends to
# nowhere. Needs root.
#   bash scripts/nat-lab.sh up P           create the namespaces (both NATs endpoint-independent)
#   bash scripts/nat-lab.sh nat P N MODE   set NAT N (1 or 2): eim (Linux's port-preserving masquerade:
#                                          endpoint-independent mapping), symmetric (a random port for every
#                                          new flow: fully-random), udp-blocked (eim, and no UDP leaves the home)
#   bash scripts/nat-lab.sh down P         remove them
set -euo pipefail
if [ "$(id -u)" != 0 ]; then echo "nat-lab: network namespaces need root" >&2; exit 1; fi
here=$(dirname "$0")
command -v ip >/dev/null || bash "$here/apt-install.sh" nat-lab iproute2
command -v nft >/dev/null || bash "$here/apt-install.sh" nat-lab nftables
# coturn runs inside the lab's public namespace (scripts/coturn.sh), which reaches no package mirror: installed
# here, from the host's network, or its install there waits out every mirror timeout (a fresh machine's NAT test
# timed out in its 180 s set-up so).
command -v turnserver >/dev/null || bash "$here/apt-install.sh" nat-lab coturn
cmd=${1:?up, nat or down}
P=${2:?a prefix for the namespaces}

nat() {
  local n=$1 mode=$2 masq=masquerade udp=''
  case "$mode" in
    eim) ;;
    symmetric) masq='masquerade fully-random' ;;
    udp-blocked) udp='iifname "lan" meta l4proto udp drop' ;;
    *) echo "nat-lab: unknown NAT mode $mode (eim, symmetric, udp-blocked)" >&2; exit 2 ;;
  esac
  ip netns exec "$P-nat$n" nft -f - <<NFT
flush ruleset
table ip nat {
  chain postrouting { type nat hook postrouting priority srcnat; oifname "wan" $masq; }
}
table ip filter {
  chain forward {
    type filter hook forward priority filter; policy accept;
    $udp
  }
  # Like a home router: what arrives unasked at the WAN side is dropped, not answered (no ICMP port unreachable).
  chain input { type filter hook input priority filter; policy accept; iifname "wan" ct state new drop; }
}
NFT
}

case "$cmd" in
  up)
    ip netns add "$P-pub"
    ip -n "$P-pub" link set lo up
    ip -n "$P-pub" addr add 100.64.0.1/32 dev lo
    ip netns exec "$P-pub" sysctl -qw net.ipv4.ip_forward=1
    # The public side's default route leads into P-sink, which drops everything: as on the internet, a packet
    # for a private address (a peer's host candidate relayed by coturn) is lost, not refused at once. Without
    # it coturn's sendto fails ENETUNREACH and coturn closes the sender's whole allocation.
    ip netns add "$P-sink"
    ip link add sink netns "$P-pub" type veth peer name in netns "$P-sink"
    ip -n "$P-pub" addr add 100.64.255.1/30 dev sink
    ip -n "$P-sink" addr add 100.64.255.2/30 dev in
    ip -n "$P-pub" link set sink up
    ip -n "$P-sink" link set in up
    ip -n "$P-pub" route add default via 100.64.255.2
    for n in 1 2; do
      ip netns add "$P-nat$n"
      ip netns add "$P-home$n"
      ip -n "$P-nat$n" link set lo up
      ip -n "$P-home$n" link set lo up
      ip link add "$P-p$n" netns "$P-pub" type veth peer name wan netns "$P-nat$n"
      ip link add lan netns "$P-nat$n" type veth peer name eth0 netns "$P-home$n"
      ip -n "$P-pub" addr add "100.64.$n.1/24" dev "$P-p$n"
      ip -n "$P-pub" link set "$P-p$n" up
      ip -n "$P-nat$n" addr add "100.64.$n.2/24" dev wan
      ip -n "$P-nat$n" addr add "192.168.$n.1/24" dev lan
      ip -n "$P-nat$n" link set wan up
      ip -n "$P-nat$n" link set lan up
      ip -n "$P-nat$n" route add default via "100.64.$n.1"
      ip netns exec "$P-nat$n" sysctl -qw net.ipv4.ip_forward=1
      ip -n "$P-home$n" addr add "192.168.$n.2/24" dev eth0
      ip -n "$P-home$n" link set eth0 up
      ip -n "$P-home$n" route add default via "192.168.$n.1"
      nat "$n" eim
    done
    ;;
  nat) nat "${3:?1 or 2}" "${4:?eim, symmetric or udp-blocked}" ;;
  down)
    for ns in pub sink nat1 nat2 home1 home2; do ip netns del "$P-$ns" 2>/dev/null || true; done
    ;;
  *) echo "nat-lab: up, nat or down" >&2; exit 2 ;;
esac
