// npm's `prepare` script: builds the library (dist/src, tsconfig.build.json) with tsc. npm runs
// it after `npm install` / `npm ci` in this folder, and when another project installs this
// folder by path (`npm install <path-to>/clients/node`) or from git. npm does not install the
// dependencies of a folder it links, so when TypeScript is missing here this first runs
// `npm ci` in this folder (dev dependencies included; with --ignore-scripts, so this script is
// not entered again).
"use strict";
const { execFileSync } = require("node:child_process");
const fs = require("node:fs");
const path = require("node:path");

const here = path.resolve(__dirname, "..");
const tsc = path.join(here, "node_modules", "typescript", "bin", "tsc");

if (!fs.existsSync(tsc)) {
  // The npm that runs this script (npm_execpath, a JavaScript file), else npm on PATH.
  const execPath = process.env.npm_execpath;
  const viaNode = execPath !== undefined && /\.[cm]?js$/.test(execPath);
  const command = viaNode ? process.execPath : "npm";
  // Explicit flags win over what a global or production install passes down in the environment.
  const args = ["ci", "--prefix", here, "--include=dev", "--global=false", "--ignore-scripts"];
  args.push("--no-audit", "--no-fund");
  process.stderr.write(`kafka-lease client: installing its build tools (npm ci in ${here})\n`);
  execFileSync(command, viaNode ? [execPath, ...args] : args, {
    cwd: here,
    stdio: ["ignore", process.stderr, process.stderr],
    shell: !viaNode && process.platform === "win32",
  });
}
execFileSync(process.execPath, [tsc, "-p", path.join(here, "tsconfig.build.json")], {
  cwd: here,
  stdio: "inherit",
});
