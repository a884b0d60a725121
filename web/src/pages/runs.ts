// Background runs (docs/background.md): a session's runs with their status,
// kept live; a run's events followed live over StreamRunEvents, resumed
// after the last event seen when the stream breaks; cancel; a paused run's
// question answered in place, after which the same stream shows the run go
// on. A run can be started here too. The API lists runs per session only
// and has no stream of a session's runs, so the list is polled while the
// page is open.
import { Code, ConnectError } from "@connectrpc/connect";
import { chat, runs, errorText, errorReason } from "../api";
import type { Run } from "../gen/cohort/v1/run_pb";
import type { ToolCall } from "../gen/cohort/v1/chat_pb";
import { h, message, field, input, textarea, button, rule, validate, required, maxRunes, onLeave, confirmButton, table, uid } from "../dom";
import { internSelect } from "../pickers";
import { Turn, finalDetails, pauseBlock, usageText, approvalModes } from "../transcript";

// How often the list is read again: a status change shows within it. A
// session whose runs have all ended is read less often (a run started
// elsewhere still appears).
const POLL_MS = 1000;
const IDLE_POLL_MS = 5000;
const ENDED = new Set(["completed", "failed", "cancelled"]);
// Refusals that a new attempt would only repeat; anything else (a broken
// connection, a gateway restarting) is retried from the last event seen.
const FINAL = new Set([Code.NotFound, Code.PermissionDenied, Code.Unauthenticated, Code.InvalidArgument, Code.FailedPrecondition]);

const stamp = (s: string | undefined) => (s ? new Date(s).toLocaleString() : "—");

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => (clearTimeout(t), resolve()), { once: true });
  });
}

// RunView is one run: its record, its question while it is paused, and its
// events, followed from the first until the run has ended.
class RunView {
  el: HTMLElement;
  private record = h("dl", { class: "record run-record" });
  private question = h("div", { class: "run-question" });
  private status = h("p", { class: "status", role: "status", id: "run-status" });
  private turn = new Turn();
  private ctl = new AbortController();
  private after = 0n;
  private finish = "";
  // The question whose block is on the page, and those answered here: the
  // list's next read may still show the run paused on them.
  private asked = "";
  private answered = new Set<string>();

  constructor(private internId: string, private run: Run, private changed: () => void) {
    const title = uid("run");
    this.el = h(
      "section",
      { class: "run-detail", "aria-labelledby": title, "data-run": run.id },
      h("h2", { id: title, tabindex: "-1" }, "Run ", h("span", { class: "mono" }, run.id)),
      this.record,
      this.question,
      this.status,
      h("div", { class: "transcript", role: "log", "aria-live": "polite", "aria-label": "Events" }, this.turn.el),
    );
    this.update(run);
  }

  stop(): void {
    this.ctl.abort();
  }

  // update shows the run as the API last read it.
  update(run: Run): void {
    this.run = run;
    this.el.dataset.status = run.status;
    const rows: [string, Node | string][] = [
      ["Status", h("span", { class: `state state-${run.status}` }, run.status + (run.cancelRequested ? " (cancel requested)" : ""))],
      ["Session", h("span", { class: "mono" }, run.sessionId ?? "—")],
      ["Created", stamp(run.createdAt)],
      ["Ended", stamp(run.endedAt)],
      ["Events", `${run.lastEventId}${run.eventsTruncated ? " (some deltas not kept: past the storage cap)" : ""}`],
    ];
    if (run.pauseDeadline) rows.push(["Question expires", stamp(run.pauseDeadline)]);
    if (run.error) rows.push(["Error", h("span", { class: "run-error" }, `${run.error.message} (${run.error.code} ${run.error.reason})`)]);
    if (run.usage) rows.push(["Usage", usageText(run.usage, "stop")]);
    this.record.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));

    const tc = run.status === "paused" ? run.pendingInteraction : undefined;
    if (tc && tc.id !== this.asked && !this.answered.has(tc.id)) {
      this.asked = tc.id;
      this.question.replaceChildren(this.ask(tc));
    } else if (!tc && this.asked) {
      // Answered elsewhere, expired, or cancelled: the block would only be refused.
      this.asked = "";
      this.question.replaceChildren();
    }
  }

  // ask is the question's block; its answer is the chat's tool message,
  // which continues the run in the background.
  private ask(tc: ToolCall): HTMLElement {
    const sessionId = this.run.sessionId ?? "";
    const box: HTMLElement = pauseBlock(tc, async (content, label) => {
      // Shown before the call: the answer's first chunks are recorded
      // before it returns, and may reach the transcript first.
      const said = h("p", { class: "answered" }, `Answered: ${label}`);
      this.turn.append(said);
      try {
        for await (const _ of chat.streamChatCompletion({
          internId: this.internId,
          sessionId,
          background: true,
          messages: [
            { role: "assistant", toolCalls: [{ index: tc.index, id: tc.id, type: tc.type, function: { name: tc.function?.name ?? "", arguments: tc.function?.arguments ?? "" } }] },
            { role: "tool", toolCallId: tc.id, content },
          ],
        })) {
          // One message, the run: its progress comes through the events.
        }
        this.answered.add(tc.id);
        if (this.asked === tc.id) {
          this.asked = "";
          this.question.replaceChildren();
        }
        // Focus was on the block just removed: keyboard users go on from the run.
        if (document.activeElement === document.body || !document.activeElement?.isConnected) this.el.querySelector("h2")?.focus();
        this.changed();
      } catch (err) {
        said.remove();
        // A malformed answer may be tried again; any other refusal
        // (expired, already answered) says the question is gone.
        const again = errorReason(err) === "bad_request";
        box.append(message("error", errorText(err)));
        box.querySelectorAll<HTMLButtonElement | HTMLInputElement | HTMLSelectElement>("button, input, select").forEach((b) => (b.disabled = !again));
      }
    });
    box.id = "run-question";
    return box;
  }

  // follow streams the run's events until it has ended, resuming after the
  // last event shown when the stream breaks (no event twice, none lost).
  async follow(): Promise<void> {
    const signal = this.ctl.signal;
    let delay = 500;
    while (!signal.aborted) {
      this.status.textContent = this.after === 0n ? "Reading the run's events…" : `Following: ${this.after} events.`;
      try {
        for await (const res of runs.streamRunEvents({ internId: this.internId, runId: this.run.id, after: this.after }, { signal })) {
          if (res.keepalive || !res.chunk) continue;
          this.after = res.seq;
          this.el.dataset.lastSeq = String(res.seq);
          delay = 500;
          const r = this.turn.chunk(res.chunk);
          if (r.finish) this.finish = r.finish;
          if (r.final) {
            this.turn.append(finalDetails(res.chunk, this.finish));
            this.finish = "";
          }
          this.status.textContent = `Following: ${this.after} events.`;
        }
        this.status.textContent = `The run has ended: ${this.after} events.`;
        this.el.dataset.followed = "ended";
        this.changed();
        return;
      } catch (err) {
        if (signal.aborted) return;
        if (err instanceof ConnectError && FINAL.has(err.code)) {
          this.status.textContent = "Cannot follow the run.";
          this.status.after(message("error", errorText(err)));
          return;
        }
        this.status.textContent = `The event stream broke (${errorText(err)}); resuming after event ${this.after}…`;
        this.el.dataset.resumes = String(Number(this.el.dataset.resumes ?? "0") + 1);
        await sleep(delay, signal);
        delay = Math.min(delay * 2, 5000);
      }
    }
  }
}

export async function runsPage(root: HTMLElement, arg: string): Promise<void> {
  const [internArg = "", sessionArg = "", runArg = ""] = arg.split("/");
  const loadOut = h("div");
  const intern = rule(await internSelect({ name: "intern", id: "runs-intern", required: true }, internArg, loadOut), required("intern"));
  const session = rule(input({ name: "session_id", id: "runs-session", autocomplete: "off", spellcheck: "false", value: sessionArg }), maxRunes("session_id", 256));
  const rowOut = h("div", { class: "out" });
  const list = h("div", { id: "runs-list" });
  const detail = h("div", { id: "run-view" });

  let stopped = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let view: RunView | null = null;
  // The list being shown, and each run's row by id (updated in place, so a
  // poll does not reset a half-pressed cancel or move focus).
  let shown = "";
  let rows = new Map<string, { tr: HTMLElement; sig: string; ended: boolean }>();
  let tbody: HTMLElement | null = null;
  let live = false;
  onLeave(() => {
    stopped = true;
    clearTimeout(timer);
    view?.stop();
  });

  // The URL names what is shown, so a reload or a shared link comes back to it.
  const remember = () => {
    const sid = session.value.trim();
    const parts = [intern.value, ...(sid ? [sid, ...(view?.el.dataset.run ? [view.el.dataset.run] : [])] : [])];
    history.replaceState(null, "", `#/runs/${parts.map(encodeURIComponent).join("/")}`);
  };

  const select = (run: Run) => {
    view?.stop();
    view = new RunView(intern.value, run, () => void tick());
    detail.replaceChildren(view.el);
    remember();
    void view.follow();
    // The record the row was built with may be a poll old.
    void tick();
    // The run is below the list: bring it into view.
    view.el.scrollIntoView({ block: "start" });
  };

  const cancel = (run: Run) => async () => {
    try {
      const res = await runs.cancelRun({ internId: intern.value, runId: run.id });
      const r = res.run;
      rowOut.replaceChildren(message("ok", r?.status === "cancelled" ? `Cancelled ${run.id}` : `Asked ${run.id} to stop; it is cancelled once the intern has stopped it`));
    } catch (err) {
      rowOut.replaceChildren(message("error", errorText(err)));
    }
    await tick();
  };

  const cells = (run: Run, ended: boolean, actions: HTMLElement | null): HTMLElement[] => [
    h("td", {}, h("span", { class: "mono" }, run.id)),
    h("td", {}, h("span", { class: `state state-${run.status}` }, run.status), run.cancelRequested ? h("span", { class: "hint" }, " cancel requested") : null),
    h("td", {}, String(run.lastEventId)),
    h("td", {}, stamp(run.createdAt)),
    h("td", {}, stamp(run.endedAt)),
    actions ??
      h(
        "td",
        {},
        h(
          "div",
          { class: "actions" },
          button("Events", () => select(run), { class: "secondary", "aria-label": `Events of ${run.id}` }),
          ended ? null : confirmButton("Cancel", "Confirm cancel", cancel(run), `Cancel ${run.id}`),
        ),
      ),
  ];

  const show = (found: Run[]) => {
    live = found.some((r) => !ENDED.has(r.status));
    if (found.length === 0) {
      list.replaceChildren(message("note", "No background runs in this session."));
      rows = new Map();
      tbody = null;
      return;
    }
    if (!tbody) {
      list.replaceChildren(table("Background runs of the session", ["Run", "Status", "Events", "Created", "Ended", "Actions"], []));
      list.querySelector("table")!.classList.add("runs");
      tbody = list.querySelector("tbody")!;
    }
    for (const run of found) {
      const ended = ENDED.has(run.status);
      const sig = JSON.stringify([run.status, run.cancelRequested, String(run.lastEventId), run.endedAt]);
      const old = rows.get(run.id);
      if (old && old.sig === sig) continue;
      // The actions are rebuilt only when the run ends (cancel goes away).
      const keep = old && old.ended === ended ? (old.tr.lastElementChild as HTMLElement) : null;
      const tr = old?.tr ?? h("tr", { "data-run": run.id });
      tr.dataset.status = run.status;
      tr.replaceChildren(...cells(run, ended, keep));
      if (!old) tbody.append(tr);
      rows.set(run.id, { tr, sig, ended });
    }
    const current = view ? found.find((r) => r.id === view!.el.dataset.run) : undefined;
    if (current) view!.update(current);
  };

  const load = async () => {
    const key = `${intern.value}/${session.value.trim()}`;
    if (!intern.value || !session.value.trim()) {
      if (key !== shown) list.replaceChildren(message("note", "Choose an intern and a session to see its background runs, or start one below."));
      shown = key;
      return;
    }
    if (key !== shown) {
      shown = key;
      rows = new Map();
      tbody = null;
      list.replaceChildren(message("note", "Loading…"));
    }
    try {
      const res = await runs.listSessionRuns({ internId: intern.value, sessionId: session.value.trim() });
      if (key === shown && !stopped) show(res.runs);
    } catch (err) {
      if (key !== shown || stopped) return;
      list.replaceChildren(message("error", errorText(err)));
      rows = new Map();
      tbody = null;
    }
  };
  // Reads are serialized: a read asked for after an action starts after it.
  let chain = Promise.resolve();
  // tick reads the list now and schedules the next read (one timer at a
  // time); actions call it so that their effect shows at once.
  const tick = async () => {
    await (chain = chain.then(load));
    clearTimeout(timer);
    if (!stopped) timer = setTimeout(tick, live ? POLL_MS : IDLE_POLL_MS);
  };

  const find = h(
    "form",
    {
      novalidate: true,
      onsubmit: async (e: Event) => {
        e.preventDefault();
        if (!validate(e.target as HTMLElement)) return;
        view?.stop();
        view = null;
        detail.replaceChildren();
        rowOut.replaceChildren();
        remember();
        await tick();
      },
    },
    field("Intern", intern),
    loadOut,
    field("Session id", session, "The session_id of a chat reply or a run (the playground shows it)."),
    h("button", { type: "submit", id: "runs-show" }, "Show runs"),
  );

  const modes = approvalModes("run-mode", "Approval mode");
  const prompt = rule(textarea({ name: "prompt", id: "run-prompt", rows: "3", required: true }), required("prompt"), maxRunes("prompt", 32000));
  const startOut = h("div", { class: "out" });
  const start = h(
    "form",
    {
      novalidate: true,
      onsubmit: async (e: Event) => {
        e.preventDefault();
        startOut.replaceChildren();
        if (!validate(find) || !validate(e.target as HTMLElement)) return;
        const b = start.querySelector("button[type=submit]") as HTMLButtonElement;
        b.disabled = true;
        try {
          let started: Run | undefined;
          for await (const res of chat.streamChatCompletion({
            internId: intern.value,
            approvalMode: modes.value(),
            sessionId: session.value.trim() || undefined,
            background: true,
            messages: [{ role: "user", content: prompt.value }],
          })) {
            if (res.run) started = (await runs.getRun({ internId: res.run.internId, runId: res.run.id })).run;
          }
          if (!started) throw new Error("the gateway answered without a run");
          prompt.value = "";
          session.value = started.sessionId ?? "";
          startOut.replaceChildren(message("ok", `Started ${started.id}`));
          await tick();
          select(started);
        } catch (err) {
          startOut.replaceChildren(message("error", errorText(err)));
        } finally {
          b.disabled = false;
        }
      },
    },
    modes.el,
    field("Prompt", prompt, "The intern and session above; an empty session id starts a new session."),
    h("button", { type: "submit", id: "run-start" }, "Start run"),
    startOut,
  );

  root.append(
    h("h1", { tabindex: "-1" }, "Background runs"),
    h("p", { class: "hint" }, "Runs that go on without a connection: follow their events live, answer a paused run's question, cancel."),
    find,
    rowOut,
    list,
    detail,
    h("h2", {}, "Start a background run"),
    start,
  );
  await tick();
  if (runArg && !stopped) {
    try {
      const res = await runs.getRun({ internId: intern.value, runId: runArg });
      if (res.run && !stopped) select(res.run);
    } catch (err) {
      detail.replaceChildren(message("error", errorText(err)));
    }
  }
}
