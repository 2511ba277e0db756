// install-cni's pure half: which file the runtime uses, and the edit that
// chains meshcap-cni last (text-preserving), converts a .conf, never doubles,
// and removes it again.
import { describe, expect, it } from 'vitest';
import { checkChain, findPrimary, insertEntry, loadConf, removeEntry, type ConfFile, type MeshcapEntry } from '../../../src/install-cni/config.js';

const entry: MeshcapEntry = { type: 'meshcap-cni', agentSocket: '/var/run/meshcap/cni.sock', agentTimeoutMs: 10000, excludeNamespaces: ['kube-system', 'meshcap-system'] };

const bridgeList = `{
  "cniVersion": "1.0.0",
  "name": "k8s-pod-network",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "mtu": 1.5e3,
      "vendorKnob": 12345678901234567890,
      "ipam": { "type": "host-local", "ranges": [[{ "subnet": "10.244.1.0/24" }]] }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ],
  "x-unknown": { "keep": [1.0, 2.50] }
}
`;

const bridgeConf = `{
    "cniVersion": "0.4.0",
    "name": "mynet",
    "type": "bridge",
    "bridge": "cni0",
    "ipam": {"type": "host-local", "subnet": "10.22.0.0/16"},
    "weird": 1.000
}`;

const primaryOf = (files: ConfFile[], o?: string) => {
  const p = findPrimary(files, o);
  if (!p) throw new Error('no primary');
  return p;
};
/** Applies an edit to a file set like the installer does. */
function apply(files: ConfFile[], override?: string): ConfFile[] {
  const e = insertEntry(primaryOf(files, override), entry);
  if (e.action === 'unchanged') return files;
  return [...files.filter((f) => f.name !== e.name && f.name !== e.remove), { name: e.name, text: e.text }];
}

describe('findPrimary: libcni order, invalid files skipped', () => {
  it('takes the first file by name among .conf, .conflist and .json', () => {
    const files = [
      { name: '20-b.conflist', text: bridgeList },
      { name: '10-a.conf', text: bridgeConf },
      { name: '05-c.json', text: bridgeConf },
      { name: '00-notes.txt', text: bridgeConf },
    ];
    expect(primaryOf(files).file.name).toBe('05-c.json');
  });
  it('skips invalid JSON, a .conflist without plugins, a .conf without type, and dot files, naming why', () => {
    const files = [
      { name: '00-broken.conflist', text: '{"cniVersion": "1.0.0", "name": "x", "plugins": [' },
      { name: '01-empty.conflist', text: '{"cniVersion": "1.0.0", "name": "x", "plugins": []}' },
      { name: '02-list-named-conf.conf', text: bridgeList },
      { name: '03-array.conf', text: '[1,2]' },
      { name: '.04-tmp.conflist', text: bridgeList },
      { name: '10-bridge.conflist', text: bridgeList },
    ];
    const p = primaryOf(files);
    expect(p.file.name).toBe('10-bridge.conflist');
    expect(p.skipped.map((s) => s.name)).toEqual(['00-broken.conflist', '01-empty.conflist', '02-list-named-conf.conf', '03-array.conf']);
    expect(p.skipped[0]!.reason).toMatch(/not valid JSON/);
    expect(p.skipped[1]!.reason).toMatch(/without plugins/);
    expect(p.skipped[2]!.reason).toMatch(/no "type"/);
  });
  it('sorts by bytes like Go (uppercase before lowercase), not by locale', () => {
    expect(primaryOf([{ name: 'a.conflist', text: bridgeList }, { name: 'B.conflist', text: bridgeList }]).file.name).toBe('B.conflist');
  });
  it('honours an override file name, and has no primary when it is missing or invalid', () => {
    const files = [{ name: '10-a.conflist', text: bridgeList }, { name: '99-mine.conflist', text: bridgeList }];
    expect(primaryOf(files, '99-mine.conflist').file.name).toBe('99-mine.conflist');
    expect(findPrimary(files, '50-none.conflist')).toBeNull();
    expect(findPrimary([{ name: 'x.conflist', text: '{' }], 'x.conflist')).toBeNull();
  });
  it('has none in an empty dir', () => {
    expect(findPrimary([])).toBeNull();
    expect(checkChain([], entry).detail).toMatch(/waiting for the primary CNI/);
  });
});

describe('insertEntry on a .conflist', () => {
  it('appends meshcap last and leaves every other byte as it was (number formats, big ints, unknown fields, order)', () => {
    const e = insertEntry(primaryOf([{ name: '10-bridge.conflist', text: bridgeList }]), entry);
    expect(e.action).toBe('inserted');
    expect(e.name).toBe('10-bridge.conflist');
    const v = JSON.parse(e.text);
    expect(v.plugins.map((p: { type: string }) => p.type)).toEqual(['bridge', 'portmap', 'meshcap-cni']);
    expect(v.plugins[2]).toEqual(entry);
    // the text before the inserted entry is the original text up to the end of portmap's entry
    const cut = bridgeList.indexOf('{ "type": "portmap", "capabilities": { "portMappings": true } }') + '{ "type": "portmap", "capabilities": { "portMappings": true } }'.length;
    expect(e.text.slice(0, cut)).toBe(bridgeList.slice(0, cut));
    expect(e.text).toContain('"mtu": 1.5e3');
    expect(e.text).toContain('"vendorKnob": 12345678901234567890');
    expect(e.text).toContain('"x-unknown": { "keep": [1.0, 2.50] }');
    expect(e.text.endsWith('}\n')).toBe(true);
    // and as JSON, everything but the new plugin is equal
    const before = JSON.parse(bridgeList);
    expect({ ...v, plugins: v.plugins.slice(0, 2) }).toEqual(before);
    expect(checkChain([{ name: e.name, text: e.text }], entry).ok).toBe(true);
  });
  it('is idempotent: a second pass changes nothing', () => {
    const once = apply([{ name: '10-bridge.conflist', text: bridgeList }]);
    const e = insertEntry(primaryOf(once), entry);
    expect(e.action).toBe('unchanged');
    expect(e.text).toBe(once[0]!.text);
  });
  it('never chains twice: an old entry (other settings, not last, or duplicated) is replaced by one last entry', () => {
    const old = { type: 'meshcap-cni', agentSocket: '/old.sock' };
    const text = JSON.stringify({ cniVersion: '1.0.0', name: 'n', plugins: [{ type: 'bridge' }, old, { type: 'portmap' }, old] }, null, 2);
    const e = insertEntry(primaryOf([{ name: '10.conflist', text }]), entry);
    expect(e.action).toBe('replaced');
    expect(JSON.parse(e.text).plugins).toEqual([{ type: 'bridge' }, { type: 'portmap' }, entry]);
  });
  it('keeps a tab-indented file tab-indented, and a compact one valid', () => {
    const tabbed = '{\n\t"cniVersion": "1.0.0",\n\t"name": "t",\n\t"plugins": [\n\t\t{\n\t\t\t"type": "ptp"\n\t\t}\n\t]\n}\n';
    const e = insertEntry(primaryOf([{ name: 'a.conflist', text: tabbed }]), entry);
    expect(e.text).toMatch(/\n\t\t\{\n\t\t\t"type": "meshcap-cni"/);
    const compact = '{"cniVersion":"0.3.1","name":"c","plugins":[{"type":"ptp"}]}';
    const c = insertEntry(primaryOf([{ name: 'a.conflist', text: compact }]), entry);
    expect(JSON.parse(c.text).plugins).toEqual([{ type: 'ptp' }, entry]);
    expect(c.text.startsWith('{"cniVersion":"0.3.1","name":"c","plugins":[{"type":"ptp"}')).toBe(true);
  });
  it('keeps CRLF line ends', () => {
    const crlf = bridgeList.replace(/\n/g, '\r\n');
    const e = insertEntry(primaryOf([{ name: 'a.conflist', text: crlf }]), entry);
    expect(e.text.replace(/\r\n/g, '')).not.toContain('\n');
    expect(JSON.parse(e.text).plugins).toHaveLength(3);
  });
});

describe('insertEntry on a .conf (converted like istio-cni)', () => {
  it('writes <name>.conflist with the old file verbatim as the first plugin and removes the .conf', () => {
    const e = insertEntry(primaryOf([{ name: '10-mynet.conf', text: bridgeConf }]), entry);
    expect(e.action).toBe('converted');
    expect(e.name).toBe('10-mynet.conflist');
    if (e.action !== 'converted') throw new Error('unreachable');
    expect(e.remove).toBe('10-mynet.conf');
    const v = JSON.parse(e.text);
    expect(v.cniVersion).toBe('0.4.0'); // the file's own version, not istio-cni's fixed 0.3.1
    expect(v.name).toBe('mynet');
    expect(v.plugins[0]).toEqual(JSON.parse(bridgeConf));
    expect(v.plugins[1]).toEqual(entry);
    expect(e.text).toContain('"weird": 1.000');
    expect(loadConf({ name: e.name, text: e.text }).ok).toBe(true);
    // the result is the primary and complete; a second pass is a no-op
    const after = apply([{ name: '10-mynet.conf', text: bridgeConf }]);
    expect(after.map((f) => f.name)).toEqual(['10-mynet.conflist']);
    expect(insertEntry(primaryOf(after), entry).action).toBe('unchanged');
  });
  it('converts a .json too, and refuses a .conf without a network name', () => {
    expect(insertEntry(primaryOf([{ name: '10-x.json', text: bridgeConf }]), entry).name).toBe('10-x.conflist');
    expect(() => insertEntry(primaryOf([{ name: '10-x.conf', text: '{"type":"bridge"}' }]), entry)).toThrow(/no "name"/);
  });
  it('when the primary CNI writes its .conf again, the .conf is the runtime\'s file again and is converted again', () => {
    const once = apply([{ name: '10-mynet.conf', text: bridgeConf }]);
    const rewritten = [...once, { name: '10-mynet.conf', text: bridgeConf }];
    expect(checkChain(rewritten, entry).ok).toBe(false);
    const again = apply(rewritten);
    expect(again.map((f) => f.name)).toEqual(['10-mynet.conflist']);
    expect(checkChain(again, entry).ok).toBe(true);
  });
});

describe('removeEntry and checkChain', () => {
  it('removes every meshcap entry and gives back the original text', () => {
    const once = apply([{ name: '10-bridge.conflist', text: bridgeList }]);
    expect(removeEntry(once[0]!)).toBe(bridgeList);
    expect(removeEntry({ name: '10-bridge.conflist', text: bridgeList })).toBeNull();
    expect(removeEntry({ name: 'x.conf', text: bridgeConf })).toBeNull();
    expect(removeEntry({ name: 'x.conflist', text: '{' })).toBeNull();
  });
  it('is not ready when meshcap is in a file the runtime does not use, or differs', () => {
    const mine = apply([{ name: '20-b.conflist', text: bridgeList }]);
    const shadowed = [...mine, { name: '10-a.conflist', text: bridgeList }];
    const c = checkChain(shadowed, entry);
    expect(c).toMatchObject({ ok: false, file: '10-a.conflist' });
    expect(c.detail).toMatch(/bridge, portmap/);
    expect(checkChain(mine, { ...entry, agentTimeoutMs: 5 }).ok).toBe(false);
    expect(checkChain(mine, entry)).toMatchObject({ ok: true, file: '20-b.conflist' });
  });
});
