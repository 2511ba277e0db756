#!/usr/bin/env python3
"""Both ends of splice-order.test.ts's backpressure/FIONREAD check (issue 20).

  splice_fionread.py proxy          uid 1337: listen 127.0.0.1:15001, accept one
                                    connection, then on each stdin line "inq"
                                    print FIONREAD; on "read" read to EOF and
                                    report the byte count and whether the bytes
                                    are the app's counter stream in order.
  splice_fionread.py app HOST PORT  connect; on a stdin line N write N more bytes
                                    of the stream (16 KiB writes, non-blocking:
                                    stops at EAGAIN); on "close" close.

One JSON line per event on stdout. The stream is big-endian u32 counters.
"""
import fcntl
import json
import socket
import struct
import sys
import termios


def say(**kw):
    print(json.dumps(kw), flush=True)


def stream(start, n):
    """Bytes [start, start+n) of the counter stream."""
    ints = b''.join(struct.pack('>I', i) for i in range(start // 4, (start + n + 3) // 4))
    return ints[start % 4:start % 4 + n]


def proxy():
    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind(('127.0.0.1', 15001))
    lst.listen(8)
    say(event='ready')
    conn, _ = lst.accept()
    say(event='accepted')
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == 'inq':
            say(event='inq', bytes=struct.unpack('i', fcntl.ioctl(conn, termios.FIONREAD, b'\0\0\0\0'))[0])
        elif cmd == 'read':
            data = bytearray()
            conn.settimeout(20)
            while True:
                b = conn.recv(65536)
                if not b:
                    break
                data += b
            say(event='read', bytes=len(data), in_order=bytes(data) == stream(0, len(data)))
            return


def app(host, port):
    s = socket.create_connection((host, port), timeout=10)
    s.setblocking(False)
    sent = 0
    say(event='connected')
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == 'close':
            s.close()
            say(event='closed')
            return
        want = int(cmd)
        data = stream(sent, want)
        off = 0
        while off < len(data):
            try:
                off += s.send(data[off:off + 16384])
            except BlockingIOError:
                break
        sent += off
        say(event='sent', bytes=off, total=sent)


if __name__ == '__main__':
    if sys.argv[1] == 'proxy':
        proxy()
    else:
        app(sys.argv[2], int(sys.argv[3]))
