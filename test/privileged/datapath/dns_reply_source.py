#!/usr/bin/env python3
# Run in a DNS-captured pod netns as a non-proxy uid. Asks the resolver given
# on the command line over UDP/IPv6 (captured: the proxy answers from
# [::1]:15053 and recvmsg6 shows the resolver), then has a host in another
# netns send a datagram to the same socket from its own address and port
# 15053: that one is not the proxy's reply and must keep its real source.
# Prints JSON {"reply_from": ..., "stranger_from": ...}.
import json, socket, subprocess, sys

resolver, stranger_ns, stranger_addr, pod_addr = sys.argv[1:5]
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.settimeout(3)
s.bind(("::", 0))
port = s.getsockname()[1]
s.sendto(b"query", (resolver, 53))
_, frm = s.recvfrom(512)
reply_from = f"[{frm[0]}]:{frm[1]}"
sender = (
    "import socket;"
    "u=socket.socket(socket.AF_INET6,socket.SOCK_DGRAM);"
    f"u.bind(('{stranger_addr}',15053));"
    f"u.sendto(b'hello',('{pod_addr}',{port}))"
)
subprocess.run(["ip", "netns", "exec", stranger_ns, "python3", "-c", sender], check=True, timeout=10)
_, frm = s.recvfrom(512)
print(json.dumps({"reply_from": reply_from, "stranger_from": f"[{frm[0]}]:{frm[1]}"}))
