// The lab for real: two namespaces joined by a veth with lab addresses, a
// server and a client process inside them, no default route anywhere, and
// close() removing processes and namespaces (also after a failed step).
import { existsSync } from 'node:fs';
import { execa } from 'execa';
import { afterAll, describe, expect, it } from 'vitest';
import { Lab, listNetns } from '../../../src/lab/index.js';

describe('lab', () => {
  const lab = new Lab('mclab');
  afterAll(() => lab.close());

  it('namespaces, a veth with lab addresses, processes inside; close() removes all of it', async () => {
    const a = await lab.netns('a');
    const b = await lab.netns('b');
    const { aIf } = await lab.link(a.name, b.name, { a4: ['198.18.60.1/24'], b4: ['198.18.60.2/24'], a6: ['2001:db8:60::1/64'] });
    expect((await execa('ip', ['-n', a.name, '-4', 'addr', 'show', aIf])).stdout).toContain('198.18.60.1/24');
    for (const ns of [a.name, b.name]) {
      expect((await execa('ip', ['-n', ns, 'route', 'show', 'default'])).stdout).toBe('');
      expect((await execa('ip', ['-n', ns, '-6', 'route', 'show', 'default'])).stdout).toBe('');
    }
    const server = lab.start('server', b.name, [process.execPath, '-e',
      "require('net').createServer((s) => s.end('hi from b')).listen(8080, '198.18.60.2', () => console.log('ready'))"]);
    await server.waitFor(/ready/, 10_000);
    const client = await execa('ip', lab.argv(a.name, [process.execPath, '-e',
      "require('net').connect(8080, '198.18.60.2').on('data', (d) => process.stdout.write(d))"], { uid: 65534 }));
    expect(client.stdout).toBe('hi from b');
    // nothing outside the lab is reachable: no route to a non-lab address
    const out = await execa('ip', lab.argv(a.name, ['ip', 'route', 'get', '192.0.2.1']), { reject: false });
    expect(out.exitCode).not.toBe(0);

    const steps = await lab.close();
    expect(steps.filter((s) => s.error)).toEqual([]);
    expect(server.running).toBe(false);
    expect(existsSync(a.path) || existsSync(b.path)).toBe(false);
    expect(await listNetns(`mclab-`)).not.toContain(a.name);
  });

  it('a link with a non-lab address fails before anything is made, and close() still removes the namespace', async () => {
    const a = await lab.netns('c');
    await expect(lab.link(a.name, a.name, { a4: ['10.0.0.1/24'] })).rejects.toThrow(/outside 198\.18\.0\.0\/15/);
    expect((await execa('ip', ['-n', a.name, '-o', 'link', 'show'])).stdout.split('\n')).toHaveLength(1); // lo only
    await lab.close();
    expect(existsSync(a.path)).toBe(false);
  });
});
