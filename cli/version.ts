/**
 * k3's version, in one place: `k3 --version`, every report's `k3_version`, and the check
 * that a one-file build runs as k3. (Its own module: reports import it without importing
 * cli/commands.ts, which loads the subcommands.)
 *
 * @module
 */

/** The version of k3. */
export const VERSION = "0.6.0";
