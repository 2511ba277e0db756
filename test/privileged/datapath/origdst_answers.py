#!/usr/bin/env python3
"""Raw SO_ORIGINAL_DST / IP6T_SO_ORIGINAL_DST answers for origdst-answers.test.ts.

  origdst_answers.py errors PORT        errno of each socket without an original destination
  origdst_answers.py proxy              listen [::]:15001; per accepted connection one JSON
                                        line with the raw IP6T_SO_ORIGINAL_DST answer
  origdst_answers.py app HOST PORT LABEL  lease flow label LABEL, send it, connect, print
                                        getpeername(); exit when the proxy closes
  origdst_answers.py late FILE          listen 0.0.0.0:15001, accept one connection, ask
                                        SO_ORIGINAL_DST only once FILE exists, print it
  origdst_answers.py hold HOST PORT     connect (IPv4), print "connected", exit when the
                                        proxy closes
"""
import errno, json, socket, struct, sys

SO_ORIGINAL_DST = 80
IP6T_SO_ORIGINAL_DST = 80
IPV6_FLOWLABEL_MGR = 32
IPV6_FLOWINFO_SEND = 33


def ask(s, level, buflen):
    try:
        raw = s.getsockopt(level, SO_ORIGINAL_DST, buflen)
        return {"errno": 0, "hex": raw.hex()}
    except OSError as e:
        return {"errno": errno.errorcode.get(e.errno, e.errno)}


def errors(port):
    out = {}
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", port)); s.listen(4)
    out["tcp4_listening"] = ask(s, socket.SOL_IP, 16)
    out["tcp4_listening_short_buffer"] = ask(s, socket.SOL_IP, 8)
    s.close()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    out["tcp4_unconnected"] = ask(s, socket.SOL_IP, 16)
    s.close()
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.bind(("::1", port)); s.listen(4)
    out["tcp6_listening"] = ask(s, socket.IPPROTO_IPV6, 28)
    s.close()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    out["udp4"] = ask(s, socket.SOL_IP, 16)
    s.close()
    print(json.dumps(out))


def proxy():
    srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("::", 15001)); srv.listen(16)
    print(json.dumps({"event": "ready"}), flush=True)
    while True:
        c, peer = srv.accept()
        print(json.dumps({"event": "accept", **ask(c, socket.IPPROTO_IPV6, 28)}), flush=True)
        c.close()


def app(host, port, label):
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    dst = socket.inet_pton(socket.AF_INET6, host)
    # struct in6_flowlabel_req: dst, label (be32), action GET, share EXCL, flags CREATE, expires, linger, pad
    req = struct.pack("=16s4sBBHHHI", dst, struct.pack("!I", label), 0, 1, 1, 0, 0, 0)
    s.setsockopt(socket.IPPROTO_IPV6, IPV6_FLOWLABEL_MGR, req)
    s.setsockopt(socket.IPPROTO_IPV6, IPV6_FLOWINFO_SEND, 1)
    s.settimeout(5)
    s.connect((host, port, label, 0))
    print(json.dumps({"event": "connected", "peer": list(s.getpeername())}), flush=True)
    s.recv(1)  # the proxy closes after answering
    s.close()


def late(path):
    import os, time
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("0.0.0.0", 15001)); srv.listen(4)
    print(json.dumps({"event": "ready"}), flush=True)
    c, peer = srv.accept()
    print(json.dumps({"event": "accept"}), flush=True)
    for _ in range(600):  # bounded: 60 s
        if os.path.exists(path):
            break
        time.sleep(0.1)
    print(json.dumps({"event": "late", **ask(c, socket.SOL_IP, 16)}), flush=True)
    c.close()


def hold(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(60)
    s.connect((host, port))
    print(json.dumps({"event": "connected"}), flush=True)
    s.recv(1)
    s.close()


if __name__ == "__main__":
    if sys.argv[1] == "errors":
        errors(int(sys.argv[2]))
    elif sys.argv[1] == "proxy":
        proxy()
    elif sys.argv[1] == "late":
        late(sys.argv[2])
    elif sys.argv[1] == "hold":
        hold(sys.argv[2], int(sys.argv[3]))
    else:
        app(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
