// `node --import ./bench/lib/ts.mjs bench/<name>/main.ts`: runs the bench
// drivers (TypeScript, like src/ and test/) straight from source, the way
// vitest runs the tests: each .ts module is transpiled on load by the
// typescript package the repo already has (no type check here: the unit
// suite's typecheck test covers bench/ through tsconfig.test.json). src/
// modules are loaded from src/, so paths relative to them (build/,
// the addon) resolve as they do from dist/.
import { register } from 'node:module';

register('./ts-hooks.mjs', import.meta.url);
