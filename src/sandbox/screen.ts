// Terminal output of the sandbox: log lines scroll, one block (the live
// table) is redrawn in place below them. Without a terminal (CI, a pipe, the
// tests) nothing is redrawn: lines are printed as they come and the block
// only when the caller commits it.
import { redrawPrefix } from './table.js';

export interface Out {
  write(s: string): unknown;
}

export class Screen {
  private blockLines = 0;
  private block = '';

  constructor(private readonly out: Out, readonly live: boolean) {}

  log(line: string): void {
    if (this.live) {
      this.out.write(redrawPrefix(this.blockLines) + line + '\n' + (this.block ? this.block + '\n' : ''));
    } else {
      this.out.write(line + '\n');
    }
  }

  /** Replace the live block (drawn at once on a terminal). */
  setBlock(text: string): void {
    this.block = text;
    if (!this.live) return;
    this.out.write(redrawPrefix(this.blockLines) + text + '\n');
    this.blockLines = text.split('\n').length;
  }

  /** Leave the block where it is (printing it now without a terminal); later output goes below it. */
  commit(): void {
    if (!this.live && this.block) this.out.write(this.block + '\n');
    this.block = '';
    this.blockLines = 0;
  }
}
