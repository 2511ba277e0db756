#!/usr/bin/env python3
"""One unconnected UDP socket, queries to two resolvers in flight, then a third
to the second one (dns-two-resolvers.test.ts). Prints [[payload, reply source], ...]."""
import json, socket, sys
r1, r2 = sys.argv[1:3]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.sendto(b"q1", (r1, 53))
s.sendto(b"q2", (r2, 53))
out = []
for _ in range(2):
    d, frm = s.recvfrom(512)
    out.append([d.decode(), f"{frm[0]}:{frm[1]}"])
# a third query to r2 after both replies
s.sendto(b"q3", (r2, 53))
d, frm = s.recvfrom(512)
out.append([d.decode(), f"{frm[0]}:{frm[1]}"])
print(json.dumps(out))
