/**
 * k3: Kimi K3 on one CPU. The command-line entry point: runs the command its arguments
 * name (cli/commands.ts) and exits with its code.
 *
 * @module
 */

import { cli } from "./cli/commands.ts";

if (import.meta.main) {
  Deno.exit(await cli(Deno.args));
}
