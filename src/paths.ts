// Locations inside the installed package (same depth from src/ and dist/).
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const projectRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const bpfObjectDir = path.join(projectRoot, 'build', 'bpf');
export const cniBinary = path.join(projectRoot, 'build', 'bin', 'meshcap-cni');
export const DEFAULT_PIN_ROOT = '/sys/fs/bpf/meshcap';
