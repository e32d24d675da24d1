// The run list's modal dialogs: edit a run's name and tags, and delete a run (asked first).
// Each is a <dialog> (focus trapped, Escape cancels) whose write sends the server's token once
// given: a 401 shows a field for it, kept for this tab (api.js).

import { api, ApiError, getToken, setToken, UnreachableError } from "../api.js";
import { h, setChildren } from "../dom.js";
import { fmtCount } from "../format.js";

/**
 * A modal <dialog> with a form. `fields` are nodes of the form; `submit(run)` does the write and
 * throws ApiError on refusal: its message is shown, and a 401 shows a field for the server's
 * token, kept for this tab and sent with the retry. `returnFocus(run, action)` gives the
 * element to focus when the dialog closes (the button that opened it, or another).
 */
function formDialog({ id, submitLabel, danger = false, fields, submit, returnFocus }) {
  const heading = h("h2", { id: `${id}-title` });
  const message = h("p", { class: "dialog-error", role: "alert" });
  const tokenInput = h("input", { class: "input", type: "password", autocomplete: "off", id: `${id}-token` });
  const tokenRow = h("label", { class: "field", hidden: true }, h("span", {}, "Server token"), tokenInput,
    h("span", { class: "field-help" }, "This server was started with --token: writes need it. It is kept for this tab only."));
  const cancel = h("button", { type: "button", class: "btn", value: "cancel", onclick: () => dialog.close("cancel") }, "Cancel");
  const ok = h("button", { type: "submit", class: `btn ${danger ? "btn-danger" : "btn-primary"}` }, submitLabel);
  const form = h("form", { method: "dialog" }, heading, fields, tokenRow, message, h("div", { class: "dialog-actions" }, cancel, ok));
  const dialog = h("dialog", { id, class: "dialog", "aria-labelledby": `${id}-title` }, form);
  document.body.appendChild(dialog);
  let run = null;
  let opener = null;
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    if (tokenInput.value) setToken(tokenInput.value.trim());
    ok.disabled = true;
    message.textContent = "";
    try {
      await submit(run);
      dialog.close("ok");
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) {
        tokenRow.hidden = false;
        message.textContent = getToken() ? "The server refused this token." : "This server needs its token.";
        tokenInput.focus();
      } else {
        message.textContent = err instanceof UnreachableError ? err.message : String(err.message || err);
      }
    } finally {
      ok.disabled = false;
    }
  });
  dialog.addEventListener("close", () => {
    dialog.dataset.result = dialog.returnValue || "cancel";
    const target = returnFocus(run, opener && opener.dataset.action);
    if (target && !target.disabled) target.focus();
  });
  return {
    dialog, heading,
    open(r, from, setup) {
      run = r;
      opener = from;
      message.textContent = "";
      tokenRow.hidden = true;
      tokenInput.value = "";
      delete dialog.dataset.result;
      if (setup) setup(r);
      dialog.showModal();
    },
  };
}

/** Tags as typed: comma-separated, trimmed, empty ones and repeats dropped. */
export function parseTags(text) {
  return [...new Set(text.split(",").map((t) => t.trim()).filter(Boolean))];
}

/**
 * The edit dialog: `open(run, opener)`; saves the name (when changed) and the tags, and hands
 * the server's answer to `onSaved(run)`.
 */
export function editRunDialog({ onSaved, returnFocus }) {
  const nameInput = h("input", { class: "input", id: "edit-name", required: true, maxlength: 256, autocomplete: "off", spellcheck: "false" });
  const tagsInput = h("input", { class: "input", id: "edit-tags", autocomplete: "off", spellcheck: "false", placeholder: "baseline, lr-sweep" });
  const d = formDialog({
    id: "edit-dialog", submitLabel: "Save", returnFocus,
    fields: [
      h("label", { class: "field", for: "edit-name" }, h("span", {}, "Name"), nameInput),
      h("label", { class: "field", for: "edit-tags" }, h("span", {}, "Tags"), tagsInput,
        h("span", { class: "field-help" }, "Separated by commas; up to 32, each up to 64 characters.")),
    ],
    async submit(run) {
      const changes = { tags: parseTags(tagsInput.value) };
      const name = nameInput.value.trim();
      if (name !== (run.name || run.id)) changes.name = name;
      onSaved(await api.updateRun(run.id, changes));
    },
  });
  return {
    open(run, from) {
      d.open(run, from, (r) => {
        d.heading.textContent = "Edit run";
        nameInput.value = r.name || r.id;
        tagsInput.value = (r.tags || []).join(", ");
      });
      nameInput.select();
    },
  };
}

/** The delete dialog: `open(run, opener)` asks first (Cancel focused); `onDeleted(run)` once it is gone. */
export function deleteRunDialog({ onDeleted, returnFocus }) {
  const what = h("p", { class: "dialog-text" });
  const d = formDialog({
    id: "delete-dialog", submitLabel: "Delete", danger: true, returnFocus,
    fields: [what],
    async submit(run) {
      try {
        await api.deleteRun(run.id);
      } catch (err) {
        if (!(err instanceof ApiError && err.status === 404)) throw err; // gone already: fine
      }
      onDeleted(run);
    },
  });
  return {
    open(run, from) {
      d.open(run, from, (r) => {
        d.heading.textContent = "Delete this run?";
        setChildren(what, "The run ", h("strong", { class: "dialog-name" }, r.name || r.id), ` (${r.id}) and all its `,
          `${fmtCount(r.steps)} stored steps will be deleted from the server. This cannot be undone.`);
      });
      d.dialog.querySelector(".dialog-actions .btn").focus(); // Cancel first: the safe choice
    },
  };
}
