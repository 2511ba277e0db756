// meshcap uninstall names the captured pods it refuses for, or detaches with
// --force: the first 20 and how many more, not a line of thousands.
import { describe, expect, it } from 'vitest';
import { someOf } from '../../../src/cli/datapath-commands.js';

describe('someOf', () => {
  const pods = (n: number) => Array.from({ length: n }, (_, i) => `ns/p${i}`);
  it('lists a short list whole', () => {
    expect(someOf(pods(3))).toBe('ns/p0, ns/p1, ns/p2');
    expect(someOf(pods(20)).split(', ')).toHaveLength(20);
  });
  it('cuts a long one after 20, saying how many more and where they are', () => {
    const s = someOf(pods(382));
    expect(s.startsWith('ns/p0, ns/p1,')).toBe(true);
    expect(s).toContain('ns/p19, ... and 362 more (meshcap status lists them)');
    expect(s).not.toContain('ns/p20,');
  });
});
