"use strict";
// The report's page: reads the embedded runs, sorts the runs' table, draws the scatter with plotly, lists the
// questions and draws a question's traces when it is first opened.
(function () {
  const $ = (selector) => document.querySelector(selector);

  /** An element with attributes (class, style, title, on<event> handlers, ...) and children (nodes or text). */
  function h(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attributes || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "style") node.style.cssText = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  const isNumber = (value) => typeof value === "number" && Number.isFinite(value);
  const clamp = (value, low, high) => Math.max(low, Math.min(high, value));
  const clamp01 = (value) => clamp(value, 0, 1);

  function fmt(value) {
    if (value === null || value === undefined) return "—";
    if (!isNumber(value)) return String(value);
    if (Number.isInteger(value)) return String(value);
    if (Math.abs(value) >= 100) return value.toFixed(0);
    if (Math.abs(value) > 0 && Math.abs(value) < 0.001) return value.toExponential(1);
    return value.toFixed(3).replace(/0+$/, "").replace(/\.$/, "");
  }

  const metricColor = (value) => `hsl(${Math.round(120 * clamp01(value))}, 70%, 86%)`;
  // A token's shade (or, for runs traced without tokens, a sentence's by its least sure token): the less sure,
  // the redder.
  const doubtShade = (prob) => `rgba(239, 68, 68, ${(0.55 * (1 - clamp01(prob))).toFixed(3)})`;
  const LEGEND_PROBS = [1, 0.8, 0.6, 0.4, 0.2, 0];

  function badge(text, kind, title) {
    return h("span", { class: `badge ${kind || ""}`, title }, text);
  }

  function more(label, content) {
    return h("details", { class: "more" }, h("summary", {}, label), content);
  }

  function textBlock(text, extraClass) {
    const value = text === null || text === undefined ? "" : String(text);
    return h("div", { class: `text ${value.length > 600 ? "long" : ""} ${extraClass || ""}` }, value);
  }

  /** Any value as readable fields: text, numbers, lists, nested objects as JSON. */
  function fields(object) {
    const list = h("dl", { class: "fields" });
    for (const [key, value] of Object.entries(object)) {
      let shown;
      if (value === null || typeof value !== "object") shown = textBlock(isNumber(value) ? fmt(value) : value);
      else if (Array.isArray(value) && value.every((item) => item === null || typeof item !== "object")) {
        shown = textBlock(value.map((item) => (isNumber(item) ? fmt(item) : item)).join(" · "));
      } else {
        const json = JSON.stringify(value, null, 1);
        shown = json.length > 300 ? more(`${json.length} characters`, h("pre", {}, json)) : h("pre", {}, json);
      }
      list.append(h("dt", {}, key), h("dd", {}, shown));
    }
    return list;
  }

  function without(step, ...keys) {
    const rest = { ...step };
    for (const key of ["step", ...keys]) delete rest[key];
    return rest;
  }

  // --- data ------------------------------------------------------------------------------------------------

  async function loadData() {
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser cannot decompress the report's data (DecompressionStream); open it in a " +
                      "current Chrome, Firefox, Safari or Edge");
    }
    const binary = atob(document.getElementById("report-data").textContent.trim());
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return JSON.parse(await new Response(stream).text());
  }

  // --- the runs' table -------------------------------------------------------------------------------------

  function compareValues(a, b) {
    const x = parseFloat(a);
    const y = parseFloat(b);
    const xNumber = a !== "" && !Number.isNaN(x);
    const yNumber = b !== "" && !Number.isNaN(y);
    if (xNumber && yNumber) return x - y;
    if (xNumber !== yNumber) return xNumber ? -1 : 1;
    return String(a).localeCompare(String(b));
  }

  function makeSortable(table) {
    const headers = [...table.tHead.rows[0].cells];
    headers.forEach((header, column) => header.addEventListener("click", () => {
      const direction = header.dataset.sort === "asc" ? "desc" : "asc";
      headers.forEach((other) => delete other.dataset.sort);
      header.dataset.sort = direction;
      const sign = direction === "asc" ? 1 : -1;
      const body = table.tBodies[0];
      const rows = [...body.rows];
      rows.sort((r1, r2) => sign * compareValues(r1.cells[column].dataset.value, r2.cells[column].dataset.value));
      body.append(...rows);
    }));
  }

  // --- the scatter -----------------------------------------------------------------------------------------

  function setupScatter(data) {
    const quality = $("#quality");
    const cost = $("#cost");
    if (!quality) {
      $("#scatter").replaceWith(h("p", { class: "muted" }, "The runs have no metrics to plot."));
      return;
    }
    const draw = () => {
      const figure = data.figures[quality.value][cost.value];
      Plotly.react("scatter", figure.data, figure.layout, { displaylogo: false, responsive: true });
      const front = data.fronts[quality.value][cost.value];
      $("#front").textContent = `On the Pareto front (no other run has at least its ${quality.value} for at most ` +
        `its cost, and better in one): ${front.join(", ")}.`;
    };
    quality.addEventListener("change", draw);
    cost.addEventListener("change", draw);
    draw();
  }

  // --- the question list -----------------------------------------------------------------------------------

  function metricChips(metrics) {
    return Object.entries(metrics || {}).map(([name, value]) =>
      h("span", { class: "metric", style: `background:${metricColor(value)}` }, `${name} ${fmt(value)}`));
  }

  function answerChip(run, row) {
    if (!row) return h("span", { class: "chip missing", title: "this run does not hold the question" }, `${run.run}: —`);
    if (row.error) return h("span", { class: "chip failed", title: row.error }, `${run.run}: ✗ ${row.error_kind}`);
    const values = Object.values(row.metrics);
    const best = values.length ? Math.max(...values) : 0;
    const scores = Object.entries(row.metrics).map(([name, value]) => `${name} ${fmt(value)}`).join(" ");
    return h("span", { class: "chip", style: `background:${metricColor(best)}`, title: `${row.prediction}\n${scores}` },
      h("b", {}, run.run), ` ${scores} · ${row.prediction}`);
  }

  function questionEntry(data, question, index) {
    const flags = [
      question.disagree ? badge("runs disagree", "warn") : null,
      question.failed ? badge("failed", "bad") : null,
      question.in_every_run ? null : badge("not in every run", "info"),
    ];
    const summary = h("summary", {},
      h("div", {}, h("span", { class: "q-number" }, `#${index + 1}`), h("span", { class: "q-text" }, question.question),
        flags),
      h("div", { class: "q-gold" }, h("span", { class: "pid" }, question.id), "  gold: ",
        h("b", {}, question.answers.join(" | ") || "—")),
      h("div", { class: "chips" }, question.rows.map((row, i) => answerChip(data.runs[i], row))));
    const entry = h("details", { class: "question", "data-index": index }, summary);
    entry.addEventListener("toggle", () => {
      if (entry.open && entry.children.length === 1) entry.append(questionBody(data, question));
    });
    return entry;
  }

  function questionBody(data, question) {
    const columns = question.rows.length;
    return h("div", { class: "runs-grid", style: `grid-template-columns: repeat(${columns}, minmax(340px, 1fr))` },
      question.rows.map((row, i) => runColumn(data.runs[i], row)));
  }

  function runColumn(run, row) {
    const column = h("div", { class: "run-column" }, h("h4", {}, run.run, " ", h("span", { class: "muted" }, run.program)));
    if (!row) {
      column.append(h("p", { class: "muted" }, "This run does not hold this question."));
      return column;
    }
    column.append(h("div", { class: "answer-box" },
      h("div", { class: "answer" }, row.error ? h("span", { class: "error" }, "failed") : row.prediction),
      metricChips(row.metrics)));
    column.append(h("div", { class: "costs" },
      `${row.lm_calls} LM calls · ${row.prompt_tokens} + ${row.completion_tokens} tokens · ` +
      `${row.retrieval_calls} retrievals · ${row.distinct_passages} passages · ${fmt(row.seconds)} s` +
      (row.attempt ? ` · attempt ${row.attempt + 1}` : "")));
    if (row.error) {
      column.append(h("div", { class: "error-box" },
        h("b", {}, row.error_kind), row.error_step ? ` in ${row.error_step}` : "",
        h("pre", {}, row.error),
        h("div", { class: "muted" }, row.trace.length ? "The steps taken before the failure:" : "No step was recorded before it.")));
    }
    if (row.outputs && Object.keys(row.outputs).length) column.append(more("other outputs", fields(row.outputs)));
    if (row.trace.length || !row.error) column.append(traceView(row.trace, run));
    return column;
  }

  // --- traces ----------------------------------------------------------------------------------------------

  const PIECE_STEPS = new Set(["sentence", "window"]);
  const STOP_REASONS = {
    t_iu: "the reviewer rejected t_iu updates of the note",
    t_ci: "t_ci collection iterations were spent",
    t_rp: "t_rp distinct passages were read",
    repeated_query: "every proposed query repeated one already asked",
  };

  function traceContext(trace, run) {
    const context = { params: run.params || {}, chosen: new Set(), dropped: new Set(), reviews: {}, action: null };
    for (const step of trace) {
      if (step.step === "chosen") (step.path || []).forEach((id) => context.chosen.add(id));
      if (step.step === "dropped") (step.ids || []).forEach((id) => context.dropped.add(id));
      if (step.step === "review") context.reviews[step.iteration] = step;
      if (step.step === "action" && !context.action) context.action = step;
    }
    return context;
  }

  function traceView(trace, run) {
    const box = h("div", { class: "trace" });
    if (!trace.length) return h("p", { class: "muted" }, "No steps recorded.");
    const context = traceContext(trace, run);
    const written = writtenAnswer(trace, context);
    if (written) box.append(written);
    box.append(h("ol", { class: "steps" }, trace.map((step) => {
      const view = VIEWS[step.step] || genericStep;
      const onPath = step.step === "candidate" && context.chosen.has(step.id);
      return h("li", { class: `step step-${step.step}${onPath ? " on-path" : ""}` }, view(step, context));
    })));
    return box;
  }

  /** The tokens of the piece a step kept: its own `tokens`, or a kept FLARE look-ahead's; null for runs traced
   * without tokens. */
  function keptTokens(step) {
    if (Array.isArray(step.tokens)) return step.tokens;
    if (Array.isArray(step.lookahead_tokens) && step.lookahead === step.text) return step.lookahead_tokens;
    return null;
  }

  /** `text` drawn token by token, each token shaded by its probability, which its title gives; null when the
   * tokens do not spell the text. A token's leading space is left unshaded. */
  function tokenSpans(text, tokens) {
    if (!Array.isArray(tokens) || !tokens.length || !tokens.every(Array.isArray) || !text) return null;
    const joined = tokens.map((token) => String(token[0])).join("");
    const start = joined.indexOf(text);
    if (start < 0) return null;
    const end = start + text.length;
    const spans = [];
    let at = 0;
    for (const [token, prob] of tokens) {
      const from = at;
      at += String(token).length;
      const shown = joined.slice(Math.max(from, start), Math.min(at, end));
      if (!shown) continue;
      const word = shown.trimStart();
      if (word.length < shown.length) spans.push(shown.slice(0, shown.length - word.length));
      if (!word) continue;
      spans.push(h("span", {
        class: "token", "data-p": prob, title: `${JSON.stringify(String(token))} p = ${fmt(prob)}`,
        style: isNumber(prob) ? `background:${doubtShade(prob)}` : null,
      }, word));
    }
    return spans;
  }

  function legend() {
    return h("span", { class: "legend", title: "token probability: the lighter, the surer" }, "token p",
      LEGEND_PROBS.map((p) => h("span", { class: "swatch", style: `background:${doubtShade(p)}` }, fmt(p))));
  }

  /** The long answer of a program that writes piece by piece, with its retrievals marked: each token shaded by its
   * probability, or, for runs traced without tokens, each piece by its draft's least sure token (when the piece is
   * that draft). */
  function writtenAnswer(trace, context) {
    const pieces = trace.filter((step) => PIECE_STEPS.has(step.step) || step.step === "write");
    if (!pieces.length) return null;
    const theta = context.params.theta;
    const drawn = pieces.map((piece) => tokenSpans(piece.text, keptTokens(piece)));
    const byToken = drawn.some(Boolean);
    const drafted = pieces.some((piece) => piece.lookahead !== undefined);
    const atTheta = isNumber(theta) ? ` (retrieval when a draft's token has p ≤ θ = ${theta})` : "";
    let caption = "the answer as written";
    if (byToken) {
      caption += `, each token shaded by its probability (hover for it)${atTheta}` +
        (drafted ? "; a sentence written again shows the rewrite's tokens" : "");
    } else if (pieces.some((piece) => isNumber(piece.min_prob))) {
      caption += `, shaded by the least sure token of each sentence's draft${atTheta}`;
    }
    const paragraph = h("div", { class: "written" },
      h("span", { class: "caption" }, caption, byToken ? legend() : null));
    pieces.forEach((piece, i) => {
      if (piece.retrieved) paragraph.append(searchMark(piece.queries || []));
      const shaded = !drawn[i] && isNumber(piece.min_prob) &&
        (piece.lookahead === undefined || piece.lookahead === piece.text);
      // FLARE writes a sentence again whenever it retrieves, unless the rewrite came out empty
      const rewritten = piece.lookahead !== undefined && piece.retrieved && piece.rewrite !== "empty";
      paragraph.append(h("span", {
        class: drawn[i] ? "piece by-token" : "piece",
        style: shaded ? `background:${doubtShade(piece.min_prob)}` : null,
        title: `${piece.step} ${piece.index + 1}` + (isNumber(piece.min_prob) ? ` · least sure token of the draft: ` +
          `p = ${fmt(piece.min_prob)}` + (rewritten ? " (the draft was rewritten after retrieval)" : "") : ""),
      }, drawn[i] || piece.text), " ");
      if (piece.step === "write" && piece.search) paragraph.append(searchMark([piece.search]));
    });
    return paragraph;
  }

  function searchMark(queries) {
    return h("span", { class: "search-mark", title: `retrieval with: ${queries.join(" | ")}` }, "search");
  }

  function query(text, label) {
    return h("div", { class: "query" }, h("span", { class: "label" }, label || "query"), " ", text);
  }

  function head(name, ...extra) {
    return h("div", { class: "step-head" }, h("span", { class: "step-name" }, name), extra);
  }

  function passages(list, newIds) {
    const fresh = new Set(newIds || []);
    const count = (list || []).length;
    const label = `${count} passage${count === 1 ? "" : "s"}` + (newIds ? `, ${fresh.size} new` : "");
    return more(label, h("ol", { class: "passages" }, (list || []).map((p) =>
      h("li", { class: fresh.has(p.id) ? "new" : null }, p.title || "", " ", h("span", { class: "pid" }, p.id),
        isNumber(p.score) ? h("span", { class: "muted" }, ` ${fmt(p.score)}`) : null))));
  }

  function probability(label, value, threshold) {
    if (!isNumber(value)) return null;
    const low = isNumber(threshold) && value <= threshold;
    return badge(`${label} ${fmt(value)}`, low ? "bad" : "", low ? `at or below θ = ${threshold}` : null);
  }

  function scoreBar(value, low, high, marks, color) {
    const span = high - low || 1;
    const at = (x) => `${(100 * (x - low) / span).toFixed(1)}%`;
    return h("div", { class: "bar" },
      h("div", { class: "fill", style: `width:${at(clamp(value, low, high))};background:${color}` }),
      marks.filter(isNumber).map((mark) => h("div", { class: "mark", style: `left:${at(mark)}`, title: `threshold ${mark}` })));
  }

  function genericStep(step) {
    return [head(step.step), fields(without(step))];
  }

  function pieceStep(step, context) {
    const rewritten = step.lookahead !== undefined && (step.lookahead !== step.text || Array.isArray(step.tokens));
    const draft = tokenSpans(step.lookahead, step.lookahead_tokens);
    const kept = tokenSpans(step.text, keptTokens(step));
    return [
      head(`${step.step} ${step.index + 1}`, step.retrieved ? badge("retrieved", "info") : null,
        probability("least sure token", step.min_prob, context.params.theta)),
      rewritten ? h("div", { class: "muted" }, "draft: ", draft ? h("span", { class: "piece by-token" }, draft) :
        h("span", { class: "piece", style: `background:${doubtShade(step.min_prob)}` }, step.lookahead)) : null,
      (step.spans || []).length ? h("div", { class: "muted" }, `unsure spans: ${step.spans.join(" | ")}`) : null,
      (step.queries || []).map((text) => query(text)),
      (step.dropped_questions || []).length ? h("div", { class: "muted" },
        `dropped questions (no "?"): ${step.dropped_questions.join(" | ")}`) : null,
      step.rewrite === "empty" ? h("div", { class: "muted" }, "the rewrite came out empty: the draft stands") : null,
      rewritten ? h("div", {}, "written: ", kept ? h("span", { class: "piece by-token" }, kept) : step.text) :
        kept ? h("div", { class: "text" }, h("span", { class: "piece by-token" }, kept)) : textBlock(step.text),
    ];
  }

  const VIEWS = {
    retrieve: (step) => [
      head("retrieve", h("span", { class: "muted" }, `${step.why || ""} · k=${step.k}`)),
      query(step.query),
      passages(step.passages, step.new_ids),
    ],
    sentence: pieceStep,
    window: pieceStep,
    write: (step) => [
      head(`write ${step.index + 1}`, step.search ? badge("search", "info") : null),
      textBlock(step.text),
      step.search ? query(step.search, "search") : null,
      step.forbidden ? h("div", { class: "muted" }, `forbidden tokens: ${step.forbidden.join(", ")}`) : null,
    ],
    stop: (step) => [
      head("stop", step.reason),
      STOP_REASONS[step.reason] ? h("div", { class: "muted" }, STOP_REASONS[step.reason]) : null,
      fields(without(step, "reason")),
    ],
    answer: (step) => [
      head("answer", probability("least sure token", step.min_token_prob),
        probability("mean token p", step.mean_token_prob)),
      textBlock(step.answer),
      step.stated !== undefined ? h("div", { class: "muted" }, `stated: ${step.stated}`) : null,
    ],
    unreadable: (step) => [head("unreadable output", badge("fallback", "bad")), fields(without(step))],

    // CRAG (and Self-CRAG): the evaluator's scores, the action, the refined strips, the knowledge search.
    evaluate: (step, context) => {
      const action = context.action || {};
      const scores = (step.scores || []).map((s) => s.score);
      const low = Math.min(-1, ...scores, ...[action.lower].filter(isNumber));
      const high = Math.max(1, ...scores, ...[action.upper].filter(isNumber));
      return [
        head("evaluate", h("span", { class: "muted" }, step.scorer)),
        (step.scores || []).map((s) => h("div", { class: "score-row", title: s.id },
          h("span", {}, s.title || s.id),
          scoreBar(s.score, low, high, [action.lower, action.upper],
            s.score > action.upper ? "#34d399" : s.score < action.lower ? "#f87171" : "#fbbf24"),
          h("span", {}, fmt(s.score)))),
      ];
    },
    action: (step) => [
      head("action", badge(step.action, { correct: "good", incorrect: "bad", ambiguous: "warn" }[step.action])),
      h("div", { class: "muted" }, `highest score ${fmt(step.max_score)}; thresholds: lower ${step.lower}, ` +
        `upper ${step.upper}`),
    ],
    refine: (step) => [
      head("refine", h("span", { class: "muted" }, `${step.source} · ${step.mode} · ${step.refinement}`)),
      h("div", { class: "muted" }, `kept ${(step.kept || []).length} of ${(step.strip_scores || []).length} strips`),
      (step.kept || []).map((strip) => h("div", { class: "strip" },
        h("span", { class: "metric", style: `background:${metricColor((strip.score + 1) / 2)}` }, fmt(strip.score)),
        strip.text)),
    ],
    rewrite: (step) => [head("rewrite"), query(step.query),
      step.reason ? h("div", { class: "muted" }, step.reason) : null],
    search: (step) => [head("knowledge search", step.skipped ? badge("skipped") : null), fields(without(step))],

    // Self-RAG: retrieval decisions, critiqued candidates, the beam and the chosen path.
    retrieval_decision: (step) => [
      head(`retrieval decision · depth ${step.depth}`, badge(step.decision, step.decision === "retrieve" ? "info" : ""),
        step.parent ? h("span", { class: "muted" }, `after ${step.parent}`) : null),
      isNumber(step.p_retrieve) ? h("div", { class: "muted" },
        `p(retrieve) ${fmt(step.p_retrieve)} ${step.p_retrieve > step.delta ? ">" : "≤"} δ ${step.delta}`) :
        h("div", { class: "muted" }, `mode ${step.mode}`),
      step.probabilities ? critiques({ decision: step.probabilities }) : null,
    ],
    candidate: (step, context) => [
      head(`candidate ${step.id}`, h("span", { class: "muted" }, `depth ${step.depth}`),
        context.chosen.has(step.id) ? badge("chosen path", "good") : null,
        context.dropped.has(step.id) ? badge("dropped", "bad") : null,
        step.continued ? badge("continued") : null, step.done ? badge("done") : null),
      step.passage ? h("div", { class: "muted" }, "passage ", h("span", { class: "pid" }, step.passage)) : null,
      textBlock(step.text),
      critiques(step.critiques || {}),
      h("div", { class: "muted" }, `sequence p ${fmt(step.sequence_prob)} · relevance ${fmt(step.relevance)} · ` +
        `support ${fmt(step.support)} · utility ${fmt(step.utility)} → score ${fmt(step.score)}, path ` +
        fmt(step.path_score)),
    ],
    beam: (step) => [head(`beam · depth ${step.depth}`),
      h("div", { class: "muted" }, `kept ${(step.kept || []).join(", ") || "none"}; finished ` +
        `${(step.finished || []).join(", ") || "none"}`)],
    dropped: (step) => [head("dropped", badge((step.ids || []).join(", "), "bad")), h("div", { class: "muted" }, step.reason)],
    no_evidence: (step) => [head(`no evidence · depth ${step.depth}`), h("div", { class: "muted" }, step.reason)],
    chosen: (step) => [head("chosen path", badge((step.path || []).join(" → "), "good")),
      h("div", { class: "muted" }, `score ${fmt(step.score)}; passages ${(step.passages || []).map((p) => p || "none").join(", ")}`)],
    contexts: (step) => [head(`knowledge forms · depth ${step.depth}`),
      h("div", { class: "muted" }, `given: ${(step.given || []).join(", ") || "none"}; empty: ${(step.empty || []).join(", ") || "none"}`)],

    // Adaptive-Note: the notes as they changed, the proposed queries, the reviewer's decisions.
    note: (step, context) => {
      const review = context.reviews[step.iteration];
      const verdict = step.iteration === 0 ? badge("first note", "info") : !review ? null :
        review.better ? badge("better: the new best note", "good") : badge("not better: the best note stays", "bad");
      return [
        head(`note ${step.iteration}`, verdict, review && isNumber(review.p_better) ? badge(`p(better) ${fmt(review.p_better)}`) : null),
        step.query ? query(step.query) : null,
        h("div", { class: "muted" }, `${(step.new_ids || []).length} new passages` +
          ((step.seen_ids || []).length ? `, ${step.seen_ids.length} already read` : "")),
        textBlock(step.note),
      ];
    },
    query: (step) => [head(`query · iteration ${step.iteration}`, step.repeated ? badge("repeats an asked query", "bad") : null),
      query(step.query)],
    review: (step) => [head(`review · note ${step.iteration}`,
      step.better ? badge("better", "good") : badge("not better", "bad"),
      isNumber(step.p_better) ? badge(`p(better) ${fmt(step.p_better)}`) : null)],

    // GenGround: deductions, grounding batches (the one that found evidence marked), each hop's outcome.
    deduce: (step) => [
      head(`deduce · hop ${step.hop}`, step.finished ? badge("final answer", "good") : null),
      step.sub_question ? query(step.sub_question, "sub-question") : null,
      h("div", {}, "deduced answer: ", h("b", {}, step.answer)),
      step.reasoning ? more("reasoning", textBlock(step.reasoning)) : null,
    ],
    ground: (step) => {
      const outputs = step.outputs || {};
      return [
        head(`ground · hop ${step.hop} · batch ${step.batch}`,
          step.evidence_found ? badge("evidence found", "good") : badge("no evidence", "")),
        h("div", { class: "muted" }, "passages ", (step.passage_ids || []).map((id) => h("span", { class: "pid" }, `${id} `))),
        (Array.isArray(outputs.evidence) ? outputs.evidence : []).map((quote) => h("div", { class: "strip" }, quote)),
        outputs.revised_answer !== undefined ? h("div", {}, "revised answer: ", h("b", {}, outputs.revised_answer)) : null,
        Object.keys(without(outputs, "evidence", "revised_answer")).length ?
          more("other outputs", fields(without(outputs, "evidence", "revised_answer"))) : null,
        step.inputs && step.inputs.passages ? more("the batch's passages", textBlock([].concat(step.inputs.passages).join("\n"))) : null,
      ];
    },
    hop: (step) => [
      head(`hop ${step.hop}`, step.revised ? badge("revised by grounding", "info") : null),
      query(step.sub_question, "sub-question"),
      h("div", {}, "answer: ", step.revised ? `${step.deduced_answer} (deduced) → ` : "", h("b", {}, step.answer)),
      h("div", { class: "muted" }, `${(step.batches || []).length} batch(es) tried; ${(step.evidence || []).length} evidence quote(s)`),
    ],
  };

  function critiques(groups) {
    const grid = h("div", { class: "critiques" });
    for (const [group, probs] of Object.entries(groups)) {
      const top = Math.max(...Object.values(probs));
      grid.append(h("span", { class: "muted" }, group), h("span", { class: "labels" },
        Object.entries(probs).map(([label, p]) => h("span", { class: p === top ? "top" : null }, `${label} ${fmt(p)}`))));
    }
    return grid;
  }

  // --- filters -----------------------------------------------------------------------------------------------

  function setupQuestions(data) {
    const list = $("#question-list");
    const entries = data.questions.map((question, index) => questionEntry(data, question, index));
    list.replaceChildren(...entries);
    const haystacks = data.questions.map((q) => [q.id, q.question, ...q.answers,
      ...q.rows.map((row) => (row ? String(row.prediction) : ""))].join("\n").toLowerCase());
    const controls = ["#f-disagree", "#f-failed", "#f-partial", "#f-metric", "#f-below", "#f-run", "#f-text"]
      .map((selector) => $(selector)).filter(Boolean);

    const metricMatches = (question) => {
      const below = $("#f-below") ? parseFloat($("#f-below").value) : NaN;
      if (Number.isNaN(below)) return true;
      const metric = $("#f-metric").value;
      const which = $("#f-run").value;
      const isBelow = (row) => row && isNumber(row.metrics[metric]) && row.metrics[metric] < below;
      const present = question.rows.filter(Boolean);
      if (which === "any") return present.some(isBelow);
      if (which === "all") return present.length > 0 && present.every(isBelow);
      return isBelow(question.rows[Number(which)]);
    };

    const apply = () => {
      const checked = (selector) => Boolean($(selector) && $(selector).checked);
      const text = $("#f-text").value.trim().toLowerCase();
      let shown = 0;
      data.questions.forEach((question, index) => {
        const visible = (!checked("#f-disagree") || question.disagree) && (!checked("#f-failed") || question.failed) &&
          (!checked("#f-partial") || !question.in_every_run) && (!text || haystacks[index].includes(text)) &&
          metricMatches(question);
        entries[index].hidden = !visible;
        shown += visible;
      });
      $("#shown-count").textContent = `${shown} of ${data.questions.length} questions shown`;
    };
    controls.forEach((control) => control.addEventListener("input", apply));
    apply();
  }

  document.querySelectorAll("table.sortable").forEach(makeSortable);
  loadData().then((data) => {
    setupScatter(data);
    setupQuestions(data);
    document.body.dataset.ready = "true";
  }).catch((error) => {
    const message = $("#load-error");
    message.hidden = false;
    message.textContent = `The report could not be drawn: ${error.message || error}`;
    console.error(error);
  });
})();
