// The entry point exports exactly what tablease.d.ts declares (typecheck/ checks the types of
// each export against the module that defines it), and newTabId's ids are what it promises:
// `node --test web/sdk/`.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import * as entry from "./tablease.js";

test("tablease.js exports exactly the values tablease.d.ts declares", () => {
  const dts = readFileSync(new URL("./tablease.d.ts", import.meta.url), "utf8");
  const declared = [...dts.matchAll(/^export declare (?:class|function|const) (\w+)/gm)].map((m) => m[1]).sort();
  assert.deepEqual(Object.keys(entry).sort(), declared);
});

test("newTabId makes 24-character ids of the characters tablease ids allow, each new", () => {
  const ids = new Set();
  for (let i = 0; i < 1000; i++) {
    const id = entry.newTabId();
    assert.match(id, /^t-[A-Za-z0-9_-]{22}$/);
    ids.add(id);
  }
  assert.equal(ids.size, 1000);
  // All 64 characters turn up: the ids use the 6 bits of each random byte.
  assert.equal(new Set([...ids].map((id) => id.slice(2)).join("")).size, 64);
});
