/**
 * Flags declared once: a flag group holds its flags' parse options and help lines; a
 * command lists its groups, and both its parser and its `--help` text are made from that
 * one declaration (as argparse does). Each group's reader lives beside the group.
 *
 * @module
 */

import type { ParseArgsConfig } from "node:util";
import { parseFlags } from "./common.ts";
import { checkInputPath } from "../engine/native/files.ts";
import { EXIT } from "../engine/errors.ts";

/** One flag: how it parses and what its help line says. */
export interface Flag {
  /** A string flag takes a value; a boolean one does not. */
  type: "string" | "boolean";
  /** The one-letter alias (`-n`), if any. */
  short?: string;
  /** May be given more than once; every value is kept. */
  multiple?: boolean;
  /** May be given more than once; a later one overrides an earlier one. */
  lastWins?: boolean;
  /** The value's placeholder in the help ("N", "DIR"). */
  value?: string;
  /**
   * The value names a file k3 reads ("input": a regular file, or `-` where stdin is
   * documented; "key": a regular file or a pipe, of which one line is read) or writes
   * ("output"). An input that exists and is anything else (a FIFO, a device, a
   * directory) is refused when the flags are parsed, before anything opens it.
   */
  file?: "input" | "key" | "output";
  /** What the flag does; later lines continue under the first. */
  help: string;
}

/** Flags of one concern (memory, sampling, ...), with the title of their help section. */
export interface FlagGroup {
  /** The group's name, unique among a command's groups. */
  name: string;
  /** The help section's title line (without the colon), or "" for none. */
  title: string;
  /** The flags, by long name. */
  flags: Record<string, Flag>;
  /** Column where the help of each flag starts (default 20). */
  column?: number;
}

/** The help flag every command has. */
export const HELP_GROUP: FlagGroup = {
  name: "help",
  title: "",
  flags: { help: { type: "boolean", short: "h", help: "this help" } },
};

/** What a command declares: the text before and after its flags, and its groups. */
export interface CommandSpec {
  /** The command's name (`run`). */
  name: string;
  /** Usage line and description, printed before the flags. */
  head: string;
  /** The groups, in help order (the help group is added last). */
  groups: FlagGroup[];
  /** Examples, printed after the flags. */
  tail: string;
}

/** The flags of one command line, as parsed. */
export interface ParsedArgs {
  /** Values by long name (strings, booleans, or lists of the `multiple` flags). */
  values: Record<string, string | boolean | string[] | undefined>;
  /** Words that are not flags (the model directory). */
  positionals: string[];
  /** The flags in command-line order (for the last-wins readers). */
  tokens: { kind: string; name?: string; value?: string }[];
  /** A string flag's value. */
  str(name: string): string | undefined;
  /** Whether a boolean flag was given. */
  bool(name: string): boolean;
  /** Every value of a `multiple` flag. */
  list(name: string): string[] | undefined;
}

/** A command's flags: the parser and the help, both from its {@link CommandSpec}. */
export interface CommandFlags {
  /** The command's name. */
  readonly name: string;
  /** Every flag the command accepts, by long name. */
  readonly flags: Readonly<Record<string, Flag>>;
  /** The groups it was made from, in help order (the help group last). */
  readonly groups: readonly FlagGroup[];
  /** The `--help` text. */
  usage(): string;
  /** Parses `args` strictly (see parseFlags in common.ts). */
  parse(args: string[], allowPositionals?: boolean): ParsedArgs;
  /** {@link parse}, except that with `--help` it prints the usage and returns undefined. */
  parseUnlessHelp(args: string[], allowPositionals?: boolean): ParsedArgs | undefined;
}

/** A help line: `  -n, --gen N` padded to the column, then the help, continued under it. */
function helpLines(name: string, flag: Flag, column: number): string {
  const label = `  ${flag.short ? `-${flag.short}, ` : ""}--${name}${flag.value ? ` ${flag.value}` : ""}`;
  const [first, ...rest] = flag.help.split("\n");
  const lead = label.length + 2 > column ? `${label}  ` : label.padEnd(column);
  return [lead + first, ...rest.map((l) => " ".repeat(column) + l)].join("\n");
}

/** The help section of one group. */
export function groupHelp(group: FlagGroup): string {
  const lines = Object.entries(group.flags).map(([n, f]) => helpLines(n, f, group.column ?? 20));
  return (group.title ? [`${group.title}:`, ...lines] : lines).join("\n");
}

/**
 * A command's flags from its groups. Throws (a programming error, not a usage error) when
 * a group is listed twice, or a long or short flag name is claimed by two groups: each
 * flag is declared once.
 */
export function commandFlags(spec: CommandSpec): CommandFlags {
  // The help line lines up with the flags above it.
  const groups = [...spec.groups, { ...HELP_GROUP, column: spec.groups.at(-1)?.column }];
  const flags: Record<string, Flag> = {};
  const owner = new Map<string, string>();
  const groupNames = new Set<string>();
  for (const g of groups) {
    if (groupNames.has(g.name)) throw new Error(`k3 ${spec.name}: flag group '${g.name}' is listed twice`);
    groupNames.add(g.name);
    for (const [name, f] of Object.entries(g.flags)) {
      for (const key of [`--${name}`, ...(f.short ? [`-${f.short}`] : [])]) {
        const other = owner.get(key);
        if (other) throw new Error(`k3 ${spec.name}: ${key} is declared by groups '${other}' and '${g.name}'`);
        owner.set(key, g.name);
      }
      flags[name] = f;
    }
  }
  const options: NonNullable<ParseArgsConfig["options"]> = {};
  for (const [name, f] of Object.entries(flags)) {
    options[name] = { type: f.type, ...(f.short ? { short: f.short } : {}), ...(f.multiple ? { multiple: true } : {}) };
  }
  const lastWins = new Set(Object.keys(flags).filter((n) => flags[n].lastWins));
  const help = [spec.head.trimEnd(), "", ...groups.map(groupHelp), "", spec.tail.trimEnd(), ""].join("\n");
  const parse = (args: string[], allowPositionals = true): ParsedArgs => {
    const { values, positionals, tokens } = parseFlags(spec.name, args, options, allowPositionals, lastWins);
    const v = values as ParsedArgs["values"];
    for (const [name, f] of Object.entries(flags)) {
      if (f.file !== "input" && f.file !== "key") continue;
      for (const path of [v[name]].flat()) {
        // `-` is stdin where documented; "" names no file (`--input-history ""`: none).
        if (typeof path !== "string" || path === "-" || path === "") continue;
        checkInputPath(path, `--${name}`, EXIT.usage, f.file === "key");
      }
    }
    return {
      values: v,
      positionals,
      tokens: tokens ?? [],
      str: (name) => v[name] as string | undefined,
      bool: (name) => v[name] === true,
      list: (name) => v[name] as string[] | undefined,
    };
  };
  return {
    name: spec.name,
    flags,
    groups,
    usage: () => help,
    parse,
    parseUnlessHelp: (args, allowPositionals) => {
      const parsed = parse(args, allowPositionals);
      if (!parsed.bool("help")) return parsed;
      console.log(help);
      return undefined;
    },
  };
}

/**
 * Where the commands together declare a thing twice: a group name that stands for
 * different flags in two commands, or one flag (same name, type and help) copied into two
 * differently named groups instead of being declared once and shared. A flag name may mean
 * different things in different commands (`--gen` per reply in chat, per run in run):
 * those are two declarations with their own help; one declaration shared by two groups is
 * declared once. Empty when everything is declared once.
 */
export function declarationClashes(commands: readonly CommandFlags[]): string[] {
  const clashes = new Set<string>();
  const groupFlags = new Map<string, { flags: string; where: string }>();
  const home = new Map<string, { group: string; flag: Flag }>();
  for (const cmd of commands) {
    for (const g of cmd.groups) {
      const names = Object.keys(g.flags).sort().join(" ");
      const seen = groupFlags.get(g.name);
      if (!seen) groupFlags.set(g.name, { flags: names, where: cmd.name });
      else if (seen.flags !== names) {
        clashes.add(`group '${g.name}' declares other flags in k3 ${cmd.name} than in k3 ${seen.where}`);
      }
      for (const [name, f] of Object.entries(g.flags)) {
        const declaration = JSON.stringify([name, f.type, f.help]);
        const other = home.get(declaration);
        if (other === undefined) home.set(declaration, { group: g.name, flag: f });
        else if (other.group !== g.name && other.flag !== f) {
          clashes.add(`--${name} is declared alike by groups '${other.group}' and '${g.name}'`);
        }
      }
    }
  }
  return [...clashes];
}
