# Issue 19 item 4, IPv6: does tcp_tw_reuse=2 reuse the app's TIME_WAIT ports when the
# destination is ::1, and when it is one of the pod's own (non-loopback) IPv6 addresses?
# Run inside a throwaway netns (docs/bench-capacity.md#ipv6 has the command); the app closes
# first, so each completed connection leaves a TIME_WAIT socket on its side.
import socket, threading, time, sys, errno, json
dst = sys.argv[1]
srv = socket.socket(socket.AF_INET6); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("::", 8080)); srv.listen(512)
def serve():
    while True:
        c, _ = srv.accept()
        d = c.recv(1); c.sendall(d)
        c.recv(1)  # wait for the client's close: the client closes first
        c.close()
threading.Thread(target=serve, daemon=True).start()
ok = fail = 0; t0 = time.time(); per_s = []
last = t0; n_last = 0
while time.time() - t0 < 4:
    s = socket.socket(socket.AF_INET6)
    try:
        s.connect((dst, 8080)); s.sendall(b"x"); s.recv(1); ok += 1
    except OSError as e:
        if e.errno != errno.EADDRNOTAVAIL: raise
        fail += 1; time.sleep(0.001)
    finally:
        s.close()
print(json.dumps({"dst": dst, "completed": ok, "EADDRNOTAVAIL": fail}))
