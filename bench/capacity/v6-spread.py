# Issue 19 item 4, IPv6: what each way of redirecting an IPv6 connection leaves the app's
# ephemeral ports. The app socket is bound to the pod's address first (as connect6's
# bpf_bind and REDIRECT both leave it), then:
#   loop   connect to [::1]:PORT                           (eBPF mode today)
#   anyip  connect to [PREFIX::<dest>]:PORT, PREFIX an AnyIP route on lo
#          (`ip -6 route add local PREFIX/96 dev lo`): a slot address per destination
#   anyip-lo  anyip, the app socket also bound to lo (SO_BINDTODEVICE after the bind), the
#          condition under which tcp_tw_reuse=2 reuses a non-loopback connection's ports
#   nat    connect to the destination itself, ip6tables REDIRECT sends it to PORT (iptables mode)
# and measures, with the port range narrowed to 64 by the caller:
#   concurrent  connections held open at once over 4 destinations before EADDRNOTAVAIL
#   churn       connections completed to one destination in 4 s, the app closing first
#               (its TIME_WAIT holds the port unless tcp_tw_reuse=2 applies: loopback only)
# Run by bench/capacity/v6-spread.sh inside a throwaway netns; prints one JSON line per mode.
import errno, json, socket, sys, threading, time

POD, PORT = "2001:db8:70::1", 15001
mode = sys.argv[1]
DESTS = ["2001:db8:71::%d" % (i + 1) for i in range(4)]

def target(i):
    if mode == "loop":
        return "::1"
    if mode.startswith("anyip"):
        return "fd6d:6300::%d" % (i + 1)  # the slot of destination i
    return DESTS[i]

srv = socket.socket(socket.AF_INET6)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("::", PORT))
srv.listen(4096)
held, peers, churn = [], [], threading.Event()

def serve():
    while True:
        c, a = srv.accept()
        peers.append(a[0])
        if churn.is_set():  # echo one byte, then wait for the app to close first
            d = c.recv(1)
            c.sendall(d)
            c.recv(1)
            c.close()
        else:
            held.append(c)

threading.Thread(target=serve, daemon=True).start()

def app_socket():
    s = socket.socket(socket.AF_INET6)
    s.setsockopt(socket.SOL_IP, 24, 1)  # IP_BIND_ADDRESS_NO_PORT, as bpf_bind's port 0
    s.bind((POD, 0))
    if mode == "anyip-lo":
        s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
    s.settimeout(3)
    return s

def why(e):
    """errno's name, or a timeout (socket.timeout has no errno): a handshake that never completes."""
    return errno.errorcode.get(e.errno, str(e.errno)) if e.errno else "timed out"

# concurrency: hold connections over 4 destinations until the kernel has no port left
socks, stop = [], None
for n in range(4 * 65536):
    s = app_socket()
    try:
        s.connect((target(n % 4), 80 if mode == "nat" else PORT))
        socks.append(s)
    except OSError as e:
        stop = why(e)
        s.close()
        break
concurrent = len(socks)
for s in socks:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST: no TIME_WAIT
    s.close()
time.sleep(0.2)
for c in held:
    c.close()

# churn: one destination, the app closes first, 4 s
churn.set()
ok = refused = 0
failed = None
t0 = time.time()
while time.time() - t0 < 4:
    s = app_socket()
    try:
        s.connect((target(3), 80 if mode == "nat" else PORT))
        s.sendall(b"x")
        s.recv(1)
        ok += 1
    except OSError as e:
        if e.errno != errno.EADDRNOTAVAIL:
            failed = why(e)
            break
        refused += 1
        time.sleep(0.001)
    finally:
        s.close()
print(json.dumps({"mode": mode, "concurrent_4_dests": concurrent, "stopped_by": stop, "churn_4s": ok,
                  "EADDRNOTAVAIL": refused, "churn_stopped_by": failed, "proxy_peer": peers[0] if peers else None}))
