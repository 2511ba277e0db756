// Per-pod inbound capture: one sk_lookup program instance per meshed pod (its
// netns cookie is a rodata constant: sk_lookup cannot ask for it), attached
// to the pod's netns through a pinned bpf_link at <pin root>/pods/<cookie>/inbound.
import { existsSync, mkdirSync, rmSync, statSync } from 'node:fs';
import * as bpf from '../native/addon.js';
import { ForeignPinError } from '../loader/datapath.js';
import { bpfFdKind, readFdinfo } from '../loader/fdinfo.js';
import { POD_INBOUND_OBJECT, POD_INBOUND_PROGRAM, POD_INBOUND_RODATA, objectPath, pinLayout } from '../loader/manifest.js';
import { u64Key } from '../maps/layout.js';

export interface InboundLink {
  pin: string;
  linkId: number;
  action: 'created' | 'adopted';
}

/** Attach (or adopt) the pod's inbound program. Idempotent for the same netns. */
export async function attachPodInbound(pinRoot: string, netns: bigint, netnsPath: string): Promise<InboundLink> {
  const L = pinLayout(pinRoot);
  const pin = L.podInbound(netns);
  const netnsIno = statSync(netnsPath).ino;
  if (existsSync(pin)) {
    const fd = bpf.objGet(pin);
    try {
      if (bpfFdKind(readFdinfo(fd)) !== 'link') throw new ForeignPinError(pin, 'expected a pinned sk_lookup link');
      const li = bpf.linkInfo(fd);
      if (li.netnsIno === netnsIno) return { pin, linkId: li.id, action: 'adopted' };
    } finally {
      bpf.closeFd(fd);
    }
    // A link for a netns that is gone (cookies are never reused, but be safe).
    rmSync(pin);
  }
  mkdirSync(L.podDir(netns), { recursive: true });
  const obj = bpf.openObject(objectPath(POD_INBOUND_OBJECT), { mapPinDir: L.maps });
  try {
    obj.setRodata(POD_INBOUND_RODATA, u64Key(netns));
    await obj.load();
    const prog = obj.programs().find((p) => p.name === POD_INBOUND_PROGRAM);
    if (!prog) throw new Error(`${POD_INBOUND_OBJECT} has no program ${POD_INBOUND_PROGRAM}: rebuild (npm run setup)`);
    const fd = bpf.linkCreateNetns(prog.fd, netnsPath, bpf.consts.attachType.SK_LOOKUP!);
    try {
      bpf.objPin(fd, pin);
      return { pin, linkId: bpf.linkInfo(fd).id, action: 'created' };
    } finally {
      bpf.closeFd(fd);
    }
  } finally {
    obj.close();
  }
}

/** Detach and unpin the pod's inbound program; fine when already gone. */
export function detachPodInbound(pinRoot: string, netns: bigint): boolean {
  const L = pinLayout(pinRoot);
  const pin = L.podInbound(netns);
  let removed = false;
  if (existsSync(pin)) {
    const fd = bpf.objGet(pin);
    try {
      if (bpfFdKind(readFdinfo(fd)) === 'link') bpf.linkDetach(fd);
    } catch {
      // A netns that died already detached its links ("defunct"): unpin only.
    } finally {
      bpf.closeFd(fd);
    }
    rmSync(pin);
    removed = true;
  }
  rmSync(L.podDir(netns), { recursive: true, force: true });
  return removed;
}

export function hasPodInbound(pinRoot: string, netns: bigint): boolean {
  return existsSync(pinLayout(pinRoot).podInbound(netns));
}
