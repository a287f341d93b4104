/**
 * k3's command table and dispatcher: which subcommands exist, `k3 --help`, and turning
 * errors into one line on stderr and a documented exit code. main.ts (the entry) and
 * `deno task demo` both run commands through `cli`.
 *
 * @module
 */

import { EXIT, K3Error, oneLine } from "../engine/errors.ts";
import { didYouMean } from "./common.ts";
import { VERSION } from "./version.ts";

type Command = (args: string[]) => Promise<number>;

/** Subcommands, loaded on demand so `--help` never needs a model or the kernels. */
const COMMANDS: Record<string, { about: string; load: () => Promise<Command> }> = {
  run: { about: "generate from a prompt", load: async () => (await import("./run.ts")).main },
  chat: {
    about: "a conversation in the chat format (REPL; reads stdin lines)",
    load: async () => (await import("./chat/main.ts")).main,
  },
  batch: {
    about: "generate for every prompt of a JSONL file (resumable)",
    load: async () => (await import("./batch.ts")).main,
  },
  serve: {
    about: "an OpenAI-compatible HTTP server (chat and completions)",
    load: async () => (await import("./serve.ts")).main,
  },
  pull: {
    about: "download a model from the Hugging Face Hub (verified, resumable)",
    load: async () => (await import("./pull/main.ts")).main,
  },
  pack: {
    about: "pack a checkpoint's trunk into one aligned file",
    load: async () => (await import("./pack.ts")).main,
  },
  tokenize: {
    about: "text to token ids",
    load: async () => (await import("./tokenize.ts")).main,
  },
  detokenize: {
    about: "token ids to text",
    load: async () => (await import("./detokenize.ts")).main,
  },
  doctor: {
    about: "check this machine: CPU, memory, disk, read speed",
    load: async () => (await import("./doctor.ts")).main,
  },
  presets: {
    about: "list the memory presets",
    load: async () => (await import("./presets.ts")).main,
  },
};

/** Usage text of `k3 --help`. */
export const USAGE = `k3 ${VERSION}: Kimi K3 on one CPU

usage: k3 <command> [options]      (k3 <command> --help, or k3 help <command>, for its options)
       k3 <model_dir> [options]     (short for k3 run <model_dir> [options])

commands:
${Object.entries(COMMANDS).map(([n, c]) => `  ${n.padEnd(12)}${c.about}`).join("\n")}

  -h, --help        this help          -V, --version    k3's version
  --list-presets    same as k3 presets

examples:
  k3 run tests/fixtures/tiny --prompt "Once upon a time" --gen 8
  k3 doctor --dir /data
  k3 help run

habits: -p/-n/-t are --prompt/--gen/--threads; -c and --ctx-size are called --context

environment: K3_LIB=PATH  kernel library to load instead of the built-in one
             K3_DEBUG=1   print stack traces of internal errors
             NO_COLOR=1   no colours (as --color never)

exit codes: 0 ok, 1 runtime failure, 2 usage, unreadable config or a path of the wrong
            kind, 4 output unsound, 130 interrupted, 141 stdout closed early (k3 ... | head:
            quietly, as a shell's SIGPIPE) (docs/troubleshooting.md: each error)
`;

/** The exit code when the reader of stdout went away (`k3 run ... | head`): 128 + SIGPIPE,
 * what a shell reports for a program the closed pipe ended. Nothing is printed. */
export const EXIT_CLOSED_STDOUT = 141;

/** True for the error a write to a closed pipe gives (EPIPE), however it was wrapped. */
export function isClosedPipe(e: unknown): boolean {
  return e instanceof Deno.errors.BrokenPipe || /Broken pipe|os error 32\b|EPIPE/.test(String((e as Error)?.message));
}

function isDirectory(path: string): boolean {
  try {
    return Deno.statSync(path).isDirectory;
  } catch {
    return false;
  }
}

/** Runs the CLI with `args`; returns the exit code. Never throws. */
export async function cli(args: string[]): Promise<number> {
  try {
    const [cmd, ...rest] = args;
    if (cmd === "help" && rest.length > 0) {
      if (rest.length === 1 && Object.hasOwn(COMMANDS, rest[0])) {
        return await cli([rest[0], "--help"]);
      }
      throw new K3Error(
        `help: no command ${JSON.stringify(rest.join(" "))} (see k3 --help)`,
        EXIT.usage,
      );
    }
    if (cmd === undefined || cmd === "--help" || cmd === "-h" || cmd === "help") {
      console.log(USAGE);
      return cmd === undefined ? EXIT.usage : EXIT.ok;
    }
    if (cmd === "--version" || cmd === "-V") {
      console.log(`k3 ${VERSION}`);
      return EXIT.ok;
    }
    if (cmd === "--list-presets") {
      if (rest.length) {
        throw new K3Error(
          `--list-presets takes no arguments, got ${JSON.stringify(rest[0])}`,
          EXIT.usage,
        );
      }
      return await (await COMMANDS.presets.load())([]);
    }
    if (cmd.startsWith("-")) {
      const flag = cmd.replace(/^-+/, "").replace(/=.*/, "");
      const hint = didYouMean(flag, ["help", "version", "list-presets"], "--");
      throw new K3Error(
        `unknown option ${JSON.stringify(cmd)}${hint}; see k3 --help` +
          (hint ? "" : ` (a command's options go after it: k3 run MODEL_DIR ${cmd} ...)`),
        EXIT.usage,
      );
    }
    if (!Object.hasOwn(COMMANDS, cmd) && isDirectory(cmd)) return await cli(["run", ...args]);
    const entry = Object.hasOwn(COMMANDS, cmd) ? COMMANDS[cmd] : undefined;
    if (!entry) {
      throw new K3Error(
        cmd.includes("/")
          ? `${cmd}: no such model directory (see k3 --help)`
          : `unknown command ${JSON.stringify(cmd)}${didYouMean(cmd, Object.keys(COMMANDS))}; see k3 --help`,
        EXIT.usage,
      );
    }
    let command: Command;
    try {
      command = await entry.load();
    } catch (e) {
      if (/Module not found/.test(String((e as Error)?.message))) {
        throw new K3Error(`k3 ${cmd} is not available in this build`);
      }
      throw e;
    }
    return await command(rest);
  } catch (e) {
    if (isClosedPipe(e)) return EXIT_CLOSED_STDOUT;
    if (e instanceof K3Error) {
      console.error(`k3: ${e.message}`);
      return e.exitCode;
    }
    const err = e as Error;
    console.error(`k3: internal error: ${oneLine(String(err?.message ?? e))}`);
    if (Deno.env.get("K3_DEBUG")) console.error(err?.stack);
    return EXIT.runtime;
  }
}
