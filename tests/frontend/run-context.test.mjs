// views/run-context.js and views/compare-settings.js: the run's context as text (pure parts).
import assert from "node:assert/strict";
import { test } from "node:test";

import { configDifferences } from "../../frontend/js/views/compare-settings.js";
import { contextSummary, flatten, gitText, hparamText, shellLine } from "../../frontend/js/views/run-context.js";

test("shellLine: a command line a shell takes back as it was (Python's shlex.join for these)", () => {
  assert.equal(shellLine(["train.py", "--lr", "3e-4", "--name", "my run", "it's"]),
    "train.py --lr 3e-4 --name 'my run' 'it'\\''s'");
  assert.equal(shellLine([]), "");
});

test("flatten, hparamText, gitText: nested config as dotted keys, values exactly as recorded", () => {
  assert.deepEqual(flatten({ a: 1, data: { name: "x", sizes: [1, 2] }, empty: {} }),
    [["a", 1], ["data.name", "x"], ["data.sizes", [1, 2]], ["empty", {}]]);
  assert.equal(hparamText(0.0003), "0.0003");
  assert.equal(hparamText([0.9, 0.95]), "[0.9, 0.95]");
  assert.equal(hparamText(null), "—");
  assert.equal(gitText({ commit: "0123456789abcdef", dirty: true }), "0123456789 (dirty)");
  assert.equal(gitText(null), "—");
});

test("contextSummary: command, commit, host and torch in one line; nothing for an old hook", () => {
  const config = { context: { argv: ["train.py"], git: { commit: "abc", dirty: false }, host: "box", versions: { torch: "2.13.0" } } };
  assert.equal(contextSummary(config), "train.py · git abc (clean) · box · torch 2.13.0");
  assert.equal(contextSummary({ every: 1 }), "");
});

test("configDifferences: only the keys whose values differ; a run without config gets null", () => {
  const runs = [
    { config: { user: { lr: 0.1, data: { name: "a", seed: 1 } } } },
    { config: { user: { lr: 0.2, data: { name: "a", seed: 1 }, extra: true } } },
    { config: { every: 1 } },
    null,
  ];
  assert.deepEqual(configDifferences(runs), [[["lr", 0.1]], [["extra", true], ["lr", 0.2]], null, null]);
  assert.deepEqual(configDifferences([{ config: { user: { lr: 1 } } }]), [[["lr", 1]]]);
});
