import { describe, expect, it } from 'vitest';
import { loadOrder, moduleName, parseModulesBuiltin, parseModulesDep } from './modules.mjs';

// Shapes taken from Debian's 6.1 modules.dep (deps of 9p and virtio_pci).
const DEP = `kernel/drivers/virtio/virtio.ko:
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/char/hw_random/virtio-rng.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/fs/netfs/netfs.ko: kernel/fs/fscache/fscache.ko
kernel/fs/fscache/fscache.ko:
kernel/net/9p/9pnet.ko:
kernel/net/9p/9pnet_virtio.ko: kernel/drivers/virtio/virtio.ko kernel/net/9p/9pnet.ko kernel/drivers/virtio/virtio_ring.ko
kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/netfs/netfs.ko
kernel/a.ko: kernel/b.ko
kernel/b.ko: kernel/a.ko
`;

describe('modules.dep resolution', () => {
  const dep = parseModulesDep(DEP);

  it('names modules the way the kernel does', () => {
    expect(moduleName('kernel/drivers/char/hw_random/virtio-rng.ko')).toBe('virtio_rng');
    expect(moduleName('kernel/fs/9p/9p.ko.xz')).toBe('9p');
  });

  it('loads every dependency before its user, once', () => {
    const order = loadOrder(dep, new Set(), ['virtio_pci', 'virtio-rng', '9pnet_virtio', '9p']);
    expect(new Set(order).size).toBe(order.length);
    const at = (n) => order.findIndex((p) => moduleName(p) === n);
    for (const [mod, deps] of dep) {
      if (at(mod) < 0) continue;
      for (const d of deps.deps) expect(at(moduleName(d)), `${d} before ${mod}`).toBeLessThan(at(mod));
    }
    // fscache is only an indirect dependency (9p -> netfs -> fscache).
    expect(at('fscache')).toBeGreaterThanOrEqual(0);
    expect(at('fscache')).toBeLessThan(at('netfs'));
  });

  it('skips built-in modules', () => {
    const builtin = parseModulesBuiltin('kernel/drivers/virtio/virtio.ko\nkernel/drivers/virtio/virtio_ring.ko\nkernel/drivers/virtio/virtio_pci.ko\n');
    const order = loadOrder(dep, builtin, ['virtio_pci', '9pnet_virtio']);
    expect(order).toEqual(['kernel/net/9p/9pnet.ko', 'kernel/net/9p/9pnet_virtio.ko']);
  });

  it('names the missing module and who needed it', () => {
    const d = parseModulesDep('kernel/x.ko: kernel/gone.ko\n');
    expect(() => loadOrder(d, new Set(), ['x'])).toThrow(/module gone \(needed by x\)/);
  });

  it('rejects a dependency cycle instead of recursing forever', () => {
    expect(() => loadOrder(dep, new Set(), ['a'])).toThrow(/cycle: a -> b -> a/);
  });
});
