package tc

//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type iface -type lpm4 -type lpm6 -type addr -type endpoint -type handed_end -type nexthop_key -type nexthop -type pair_key4 -type pair_key6 -type pair -type counter fastpath bpf/fastpath.c
