# Accepts connections on PORT inside the test netns and answers each with the
# connection's original destination (getsockopt SO_ORIGINAL_DST), which is
# what Envoy reads after an iptables REDIRECT. Bounded: exits after COUNT
# connections or TIMEOUT seconds without one.
import socket, struct, sys

port, count, timeout = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
SO_ORIGINAL_DST = 80
srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", port))
srv.listen(16)
srv.settimeout(timeout)
print("listening", flush=True)
for _ in range(count):
    try:
        conn, _peer = srv.accept()
    except socket.timeout:
        break
    raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    dport, = struct.unpack_from("!H", raw, 2)
    dip = socket.inet_ntoa(raw[4:8])
    conn.sendall(f"ORIG {dip}:{dport} VIA {port}\n".encode())
    conn.close()
