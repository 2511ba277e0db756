// Types of progress.mjs for the TypeScript bench drivers (bench/).
export function fmt(s: number): string;
export interface StepProgress {
  step(label: string): void;
  log(s: string): void;
  done(): void;
}
export function createStepProgress(o: { name: string; total: number; write?: (s: string) => void; out?: (s: string) => void; tty?: boolean; now?: () => number }): StepProgress;
