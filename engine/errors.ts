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

/**
 * `s` as one printable line: control characters (newlines, carriage returns, escapes, the
 * Unicode line and paragraph separators) become visible escapes such as `\n`, so user data
 * quoted in a message (a tensor name, V8's JSON.parse excerpt) can never forge extra
 * `k3:` lines or move the cursor.
 */
export function oneLine(s: string): string {
  // deno-lint-ignore no-control-regex
  return s.replace(/[\u0000-\u001f\u007f-\u009f\u2028\u2029]/g, (c) => {
    const named: Record<string, string> = { "\n": "\\n", "\r": "\\r", "\t": "\\t" };
    return named[c] ?? `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`;
  });
}

/** An error the CLI prints as one line and turns into an exit code. */
export class K3Error extends Error {
  /** A failure with its message (one line) and exit code. */
  constructor(message: string, readonly exitCode: number = EXIT.runtime) {
    super(oneLine(message));
    this.name = "K3Error";
  }
}

/** A usage error (exit 2). */
export function usageError(message: string): K3Error {
  return new K3Error(message, EXIT.usage);
}
