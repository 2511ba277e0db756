// The /proc/net/tcp parser that finds a running proxy's inbound listener.
import { describe, expect, it } from 'vitest';
import { parseListeners } from '../../../src/pod-datapath/ebpf-listeners.js';

// Real lines (kernel 6.x layout): a v4 listener on 15006 (0x3A9E), one on
// 15001, and an established connection whose local port is also 15006.
const TCP = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:3A9E 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1337        0 123456 1 0000000000000000 100 0 0 10 0
   1: 00000000:3A99 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1337        0 123457 1 0000000000000000 100 0 0 10 0
   2: 0100C6C6:3A9E 0200C6C6:D431 01 00000000:00000000 00:00000000 00000000  1337        0 123458 1 0000000000000000 20 4 30 10 -1
`;
const TCP6 = `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:3A9E 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1337        0 223456 1 0000000000000000 100 0 0 10 0
`;

describe('parseListeners', () => {
  it('returns LISTEN sockets on the port only, with their inode and family', () => {
    expect(parseListeners(TCP, 4, 15006)).toEqual([{ inode: 123456, family: 4 }]);
    expect(parseListeners(TCP, 4, 15001)).toEqual([{ inode: 123457, family: 4 }]);
    expect(parseListeners(TCP6, 6, 15006)).toEqual([{ inode: 223456, family: 6 }]);
  });
  it('finds nothing for another port, an empty table or garbage', () => {
    expect(parseListeners(TCP, 4, 8080)).toEqual([]);
    expect(parseListeners('', 4, 15006)).toEqual([]);
    expect(parseListeners('header\nnot a table line\n', 4, 15006)).toEqual([]);
  });
});
