/**
 * Errors that end a run with a documented exit code and a one-line message.
 *
 * @module
 */

/** Exit codes of the k3 tool. */
export const EXIT = {
  ok: 0,
  /** Bind or forward failure, missing tensor, bad file, memory refusal. */
  runtime: 1,
  /** Usage error, or a config that cannot be read with confidence. */
  usage: 2,
  /** The run finished but its output is unsound (e.g. an expert failed to load). */
  unsound: 4,
} as const;

/** An error the CLI prints as one line and turns into an exit code. */
export class K3Error extends Error {
  constructor(message: string, readonly exitCode: number = EXIT.runtime) {
    super(message);
    this.name = "K3Error";
  }
}

/** A usage error (exit 2). */
export function usageError(message: string): K3Error {
  return new K3Error(message, EXIT.usage);
}
