// The CNI rules meshcap implements twice: here for the agent, and in C in the
// forwarder that the runtime executes (native/cni/src: the verbs[] table in
// main.c, cni_error.{c,h}, cni_config.h). Plain data with no imports, so that
// every other module of src/cni/ can build on it.
// test/unit/cni/c-forwarder-drift.test.ts reads the C tables and runs the
// built forwarder, and fails when the two sides disagree.

/** The verbs a plugin is called with, apart from VERSION (which needs no agent). */
export const CNI_VERBS = ['ADD', 'DEL', 'CHECK', 'STATUS', 'GC'] as const;
export type CniCommand = (typeof CNI_VERBS)[number];

/** The spec versions meshcap speaks, oldest first. */
export const SUPPORTED_VERSIONS = ['0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'] as const;
export type CniVersion = (typeof SUPPORTED_VERSIONS)[number];
export const LATEST_VERSION: CniVersion = '1.1.0';

/** First spec version that has each verb (CHECK came in 0.4.0, STATUS/GC in 1.1.0). */
export const VERB_MIN_VERSION: Record<CniCommand | 'VERSION', CniVersion> = {
  ADD: '0.3.0',
  DEL: '0.3.0',
  CHECK: '0.4.0',
  STATUS: '1.1.0',
  GC: '1.1.0',
  VERSION: '0.3.0',
};

export type RequiredEnvVar = 'CNI_CONTAINERID' | 'CNI_NETNS' | 'CNI_IFNAME';

/** The spec's required variables per verb, in this order (CNI_ARGS and CNI_PATH are optional). */
export const REQUIRED_ENV: Record<CniCommand, readonly RequiredEnvVar[]> = {
  ADD: ['CNI_CONTAINERID', 'CNI_NETNS', 'CNI_IFNAME'],
  CHECK: ['CNI_CONTAINERID', 'CNI_NETNS', 'CNI_IFNAME'],
  DEL: ['CNI_CONTAINERID', 'CNI_IFNAME'],
  STATUS: [],
  GC: [],
};

/** The spec's well-known error codes (SPEC.md "Error"), plus 999 for the unexpected. */
export const CNI_ERROR_CODES = {
  INCOMPATIBLE_VERSION: 1,
  UNSUPPORTED_FIELD: 2,
  UNKNOWN_CONTAINER: 3,
  INVALID_ENV: 4,
  IO_FAILURE: 5,
  DECODE_FAILURE: 6,
  INVALID_NETWORK_CONFIG: 7,
  INVALID_NETNS: 8,
  TRY_AGAIN_LATER: 11,
  PLUGIN_NOT_AVAILABLE: 50,
  LIMITED_CONNECTIVITY: 51,
  INTERNAL: 999,
} as const;

/**
 * What counts as a version string: x.y.z with at most 3 digits per part. An
 * error echoes the caller's version only if it matches this, so arbitrary
 * input is never echoed back to the runtime.
 */
export const VERSION_PATTERN = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/;

/** The spec's rule for network names and container ids. */
export const NAME_PATTERN = '^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$';

/** Limits on the forwarder's own config keys, checked on both sides. */
export const AGENT_SOCKET_MAX_LENGTH = 107; // sun_path minus its NUL
export const AGENT_TIMEOUT_MAX_MS = 600_000;
