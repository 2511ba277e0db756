import { describe, expect, it } from 'vitest';
import { findBpffs, findCgroup2, parseMountinfo } from '../../../src/loader/mounts.js';

const hybrid = `22 1 0:21 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 23 0:40 / /sys/fs/bpf rw,relatime - bpf bpf rw
`;
const unified = `30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
`;
const container = `30 24 0:26 /kubepods/pod1 /sys/fs/cgroup ro - cgroup2 cgroup2 rw
31 24 0:26 / /host/cgroup rw - cgroup2 cgroup2 rw
`;

describe('mountinfo', () => {
  it('finds cgroup v2 on a hybrid host (/sys/fs/cgroup/unified)', () => {
    expect(findCgroup2(parseMountinfo(hybrid))).toBe('/sys/fs/cgroup/unified');
    expect(findBpffs(parseMountinfo(hybrid))).toBe('/sys/fs/bpf');
  });
  it('finds cgroup v2 on a unified host, with optional fields', () => {
    expect(findCgroup2(parseMountinfo(unified))).toBe('/sys/fs/cgroup');
    expect(findBpffs(parseMountinfo(unified))).toBeNull();
  });
  it('prefers the mount of the hierarchy root over a namespaced sub-tree', () => {
    expect(findCgroup2(parseMountinfo(container))).toBe('/host/cgroup');
  });
  it('decodes octal escapes in paths', () => {
    const m = parseMountinfo('40 1 0:1 / /mnt/with\\040space rw - cgroup2 none rw\n');
    expect(m[0]!.mountPoint).toBe('/mnt/with space');
  });
  it('has no cgroup2 when none is mounted', () => {
    expect(findCgroup2(parseMountinfo('22 1 0:21 / / rw - ext4 /dev/vda rw\n'))).toBeNull();
  });
});
