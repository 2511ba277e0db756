#!/usr/bin/env python3
# Large getsockopt answers, as kube-proxy's iptables-legacy and other node
# software ask them, printed as JSON (length, errno, sha256 of the bytes) so a
# test can compare them with and without meshcap's cgroup/getsockopt program.
# Run as root inside the network namespace to examine.
import ctypes, ctypes.util, hashlib, json, os, socket, struct, sys

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)

def raw_getsockopt(fd, level, opt, buf):
    n = ctypes.c_uint32(len(buf))
    cbuf = ctypes.create_string_buffer(bytes(buf), len(buf))
    r = libc.getsockopt(fd, level, opt, cbuf, ctypes.byref(n))
    err = ctypes.get_errno() if r != 0 else 0
    return err, cbuf.raw[: n.value] if r == 0 else b""

def result(err, data):
    return {"errno": err, "len": len(data), "sha256": hashlib.sha256(data).hexdigest()}

out = {}

# iptables-legacy's table dump: IPT_SO_GET_INFO for the size, then
# IPT_SO_GET_ENTRIES with a buffer of exactly that size (>> a page here).
IPT_SO_GET_INFO, IPT_SO_GET_ENTRIES = 64, 65
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
name = b"filter".ljust(32, b"\0")
err, info = raw_getsockopt(s.fileno(), socket.SOL_IP, IPT_SO_GET_INFO, name + b"\0" * (84 - 32))
if err:
    out["ipt_get_entries"] = {"errno": err, "len": 0, "sha256": ""}
else:
    size = struct.unpack_from("=I", info, 80)[0]  # ipt_getinfo.size
    req = name + struct.pack("=I", size) + b"\0" * 4 + b"\0" * size  # ipt_get_entries header is 40 bytes (name, size, pad)
    req = req[:40] + b"\0" * size
    err, data = raw_getsockopt(s.fileno(), socket.SOL_IP, IPT_SO_GET_ENTRIES, req)
    out["ipt_get_entries"] = result(err, data)
    out["ipt_entries_size"] = size
s.close()

# SO_PEERGROUPS of a process with 2,500 supplementary groups: 10,000 bytes.
os.setgroups(list(range(100000, 102500)))
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
SO_PEERGROUPS = 59
err, data = raw_getsockopt(a.fileno(), socket.SOL_SOCKET, SO_PEERGROUPS, b"\0" * 16384)
out["so_peergroups"] = result(err, data)

# A plain option asked with an 8 KiB buffer.
t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
err, data = raw_getsockopt(t.fileno(), socket.SOL_SOCKET, socket.SO_RCVBUF, b"\0" * 8192)
out["so_rcvbuf_8k"] = result(err, data)

json.dump(out, sys.stdout)
