import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { pinLayout } from '../../../src/loader/manifest.js';

describe('pinLayout', () => {
  // podDir/podInbound join by hand (a pass asks for 10,000 of them): they must
  // name what path.join names, whatever form the pin root is given in.
  it.each(['/sys/fs/bpf/meshcap', '/sys/fs/bpf/meshcap/', '/sys/fs/bpf//a/../meshcap', 'relative/root', ''])('pod paths under %j are path.join\'s', (root) => {
    const L = pinLayout(root);
    for (const cookie of [1n, 4097n, 2n ** 62n + 7n, 2n ** 64n - 1n]) {
      expect(L.podDir(cookie)).toBe(path.join(root, 'pods', cookie.toString()));
      expect(L.podInbound(cookie)).toBe(path.join(root, 'pods', cookie.toString(), 'inbound'));
    }
    expect(L.pods).toBe(path.join(root, 'pods'));
  });
});
