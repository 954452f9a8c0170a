// The entry point exports exactly what tablease.d.ts declares (typecheck/ checks the types of
// each export against the module that defines it): `node --test web/sdk/`.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import * as entry from "./tablease.js";

test("tablease.js exports exactly the values tablease.d.ts declares", () => {
  const dts = readFileSync(new URL("./tablease.d.ts", import.meta.url), "utf8");
  const declared = [...dts.matchAll(/^export declare (?:class|function|const) (\w+)/gm)].map((m) => m[1]).sort();
  assert.deepEqual(Object.keys(entry).sort(), declared);
});
