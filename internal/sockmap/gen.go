package sockmap

//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type sock_key -type lpm4 -type lpm6 -type addr -type settings -type counter -type ledger sockmap bpf/sockmap.c
