// @ts-check
// The kernel matrix: which Debian kernel packages we boot, where apt finds
// them, and the mode `meshcap probe` must choose on each.
//
// Each entry gets its own private apt sources (never /etc/apt): bullseye is
// not a source of this Debian 12 machine, and a private list also makes the
// download independent of whatever the host's apt lists hold.

const KEYRING = '/usr/share/keyrings/debian-archive-keyring.gpg';
const deb = (base, suite) => `deb [signed-by=${KEYRING}] http://deb.debian.org/${base} ${suite} main`;

/**
 * @typedef {object} KernelSpec
 * @property {string} id            short name used on the command line and in reports
 * @property {string[]} sources     apt sources.list lines (one-line format)
 * @property {string} metaPackage   package whose Depends names the current linux-image-<release> package
 * @property {'ebpf'|'iptables'} expectedMode  what `meshcap probe` must pick on this kernel
 * @property {string} why           why that mode is expected (shown when the check fails)
 * @property {boolean} forceIptables  on a kernel whose probe picks eBPF: run the suite with MESHCAP_MODE=ebpf,
 *   then the mode-parametrised tests with MESHCAP_MODE=iptables (iptables forced where eBPF would be chosen)
 */

/** @type {KernelSpec[]} */
export const MATRIX = [
  {
    id: '5.10',
    sources: [deb('debian', 'bullseye'), deb('debian-security', 'bullseye-security')],
    metaPackage: 'linux-image-amd64',
    // Every hook exists (sk_lookup 5.9, cgroup getsockopt 5.3), but
    // SO_NETNS_COOKIE, which the agent uses to key a pod by its netns, is 5.14.
    expectedMode: 'iptables',
    why: 'SO_NETNS_COOKIE (pod identity) needs 5.14',
    forceIptables: false,
  },
  {
    id: '6.1',
    sources: [deb('debian', 'bookworm'), deb('debian-security', 'bookworm-security')],
    metaPackage: 'linux-image-amd64',
    expectedMode: 'ebpf',
    why: 'all hooks and helpers present',
    forceIptables: false,
  },
  {
    // Debian ships 6.12 for bookworm in bookworm-security (the LTS kernel that
    // trixie uses); bookworm-backports is not needed.
    id: '6.12',
    sources: [deb('debian', 'bookworm'), deb('debian-security', 'bookworm-security')],
    metaPackage: 'linux-image-6.12-amd64',
    expectedMode: 'ebpf',
    why: 'all hooks and helpers present',
    forceIptables: true,
  },
];

/**
 * @param {string[]|undefined} ids  subset requested on the command line
 * @returns {KernelSpec[]}
 */
export function selectKernels(ids) {
  if (!ids || ids.length === 0) return MATRIX;
  return ids.map((id) => {
    const k = MATRIX.find((m) => m.id === id);
    if (!k) throw new Error(`unknown kernel '${id}': the matrix has ${MATRIX.map((m) => m.id).join(', ')}`);
    return k;
  });
}
